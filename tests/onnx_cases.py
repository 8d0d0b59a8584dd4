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


# ------------------------------------------ hostile to the conversion check (IR 14, opset 28)

TODAY_IR, TODAY_OPSET = 14, 28


def _today(graph) -> bytes:
    return helper.make_model(graph, ir_version=TODAY_IR, opset_imports=[
        helper.make_opsetid("", TODAY_OPSET)]).SerializeToString()


def todays_huge_input() -> bytes:
    """An input declaring 2**40 elements (4 TiB of FP32): a few bytes of file."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "huge_input",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2**20, 2**20])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2**20, 2**20])])
    return _today(graph)


def todays_constant_of_shape(nbytes: int = 1024**3) -> bytes:
    """A small input plus ConstantOfShape filling `nbytes` of FP32 from a constant shape."""
    shape = helper.make_tensor("shape", TensorProto.INT64, [1], [nbytes // 4])
    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["big"],
                          value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
         helper.make_node("ReduceSum", ["big"], ["total"], keepdims=0),
         helper.make_node("Add", ["x", "total"], ["y"])], "constant_of_shape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], [shape])
    return _today(graph)


def todays_long_loop(iterations: int = 300_000) -> bytes:
    """A Loop of `iterations` trips adding 1 to a scalar: tiny file, long to run."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["acc_in", "one"], ["acc_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1])],
        [helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "cond", "x"], ["y"], body=body)], "long_loop",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [helper.make_tensor("trips", TensorProto.INT64, [], [iterations]),
         helper.make_tensor("cond", TensorProto.BOOL, [], [True])])
    return _today(graph)
