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


def todays_mlp(seed: int = 0) -> bytes:
    """A small MLP saved the way today's exporters save it: onnx 1.23's make_model defaults, IR 14
    and opset 28 (more than onnxruntime 1.31 loads). Every op exists in both opsets."""
    import numpy as np
    from onnx import numpy_helper

    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array((rng.standard_normal((8, 16)) / 3).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b1")
    w2 = numpy_helper.from_array((rng.standard_normal((16, 3)) / 4).astype(np.float32), "w2")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]),
         helper.make_node("Add", ["h", "b1"], ["a"]), helper.make_node("Relu", ["a"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["z"]),
         helper.make_node("Softmax", ["z"], ["y"], axis=-1)],
        "todays_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [w1, b1, w2],
    )
    return helper.make_model(graph, producer_name="exporter-of-today").SerializeToString()


def todays_swiglu() -> bytes:
    """IR 14 / opset 28 with SwiGLU, an operator that first appears in opset 28: no adapter can
    take it down to an opset onnxruntime 1.31 loads."""
    graph = helper.make_graph(
        [helper.make_node("SwiGLU", ["a", "b"], ["y"])], "swiglu",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    return helper.make_model(graph).SerializeToString()
