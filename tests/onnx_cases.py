"""Broken and edge-case ONNX files for validation specs (the healthy ones: registry.samples)."""

from onnx import TensorProto, helper

from registry.samples import IR_VERSION, OPSET, mlp


def checker_failure() -> bytes:
    """A graph whose node reads an input nobody defines: parses, but the checker rejects it."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["missing"], ["y"])], "broken",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, ir_version=IR_VERSION,
                              opset_imports=[helper.make_opsetid("", OPSET)])
    return model.SerializeToString()


def too_new_ir() -> bytes:
    """What onnx 1.23's make_model writes by default: IR 14, which onnxruntime 1.31 refuses."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    return helper.make_model(graph, ir_version=14,
                             opset_imports=[helper.make_opsetid("", OPSET)]).SerializeToString()


def truncated() -> bytes:
    data = mlp()
    return data[: len(data) // 2]
