"""ONNX models the fault specs need, built with the onnx helper API."""

from __future__ import annotations

from onnx import TensorProto as T
from onnx import helper as h

#: Loop iterations onnxruntime's CPU provider runs per second here (measured: ~1.3 M/s).
ITERATIONS_PER_SECOND = 1_300_000


def slow_warmup(seconds: float) -> bytes:
    """A valid model whose one inference (validation's warm-up) takes about `seconds`: a Loop
    adding 1 that many times. onnxruntime releases the GIL while it runs, as with real models."""
    body = h.make_graph(
        [h.make_node("Add", ["acc_in", "one"], ["acc_out"]),
         h.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [h.make_tensor_value_info("i", T.INT64, []),
         h.make_tensor_value_info("cond_in", T.BOOL, []),
         h.make_tensor_value_info("acc_in", T.FLOAT, [1])],
        [h.make_tensor_value_info("cond_out", T.BOOL, []),
         h.make_tensor_value_info("acc_out", T.FLOAT, [1])],
        [h.make_tensor("one", T.FLOAT, [1], [1.0])])
    graph = h.make_graph(
        [h.make_node("Loop", ["M", "cond", "x"], ["y"], body=body)], "slow",
        [h.make_tensor_value_info("x", T.FLOAT, [1])],
        [h.make_tensor_value_info("y", T.FLOAT, [1])],
        [h.make_tensor("M", T.INT64, [], [int(seconds * ITERATIONS_PER_SECOND)]),
         h.make_tensor("cond", T.BOOL, [], [True])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    return model.SerializeToString()
