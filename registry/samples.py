"""Small real ONNX models built with onnx.helper: the demo model, test fixtures and benchmarks.

IR version and opset are pinned because onnx writes an IR version newer than onnxruntime
loads; everything here loads on onnxruntime >= 1.17.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 9
OPSET = 17


def _model(graph: onnx.GraphProto, *, producer: str = "mmc-samples") -> bytes:
    model = helper.make_model(
        graph,
        ir_version=IR_VERSION,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name=producer,
    )
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()


def mlp(
    n_in: int = 64, hidden: tuple[int, ...] = (256, 256), n_out: int = 10, *, seed: int = 0,
    input_name: str = "x", output_name: str = "y", extra_layers: int = 0,
) -> bytes:
    """MLP n_in -> hidden... -> n_out with ReLU, dynamic batch. `extra_layers` makes it slower."""
    rng = np.random.default_rng(seed)
    sizes = [n_in, *hidden, *([hidden[-1]] * extra_layers if hidden else []), n_out]
    nodes, inits, prev = [], [], input_name
    for i, (a, b) in enumerate(zip(sizes, sizes[1:], strict=False)):
        w = (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
        bias = (rng.standard_normal(b) * 0.01).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(bias, f"b{i}")]
        last = i == len(sizes) - 2
        mm, add = f"mm{i}", output_name if last else f"add{i}"
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [mm]),
                  helper.make_node("Add", [mm, f"b{i}"], [add])]
        if not last:
            nodes.append(helper.make_node("Relu", [add], [f"relu{i}"]))
            add = f"relu{i}"
        prev = add
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", n_in])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["batch", n_out])],
        inits,
    )
    return _model(graph)


def conv_net(channels: int = 16, size: int = 224, n_out: int = 10, *, seed: int = 0) -> bytes:
    """A small conv net on 3 x size x size: two strided convs, global pooling, a dense head."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((channels, 3, 3, 3)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((channels * 2, channels, 3, 3)) * 0.1).astype(np.float32)
    wd = (rng.standard_normal((channels * 2, n_out)) * 0.1).astype(np.float32)
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
             numpy_helper.from_array(wd, "wd")]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["gp"]),
        helper.make_node("Flatten", ["gp"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "wd"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", n_out])],
        inits,
    )
    return _model(graph)


def identity(elem_type: int, shape: list, *, name: str = "x", out: str = "y") -> bytes:
    """Echo one tensor of any ONNX element type (strings too): exercises every v2 datatype."""
    graph = helper.make_graph(
        [helper.make_node("Identity", [name], [out])], "identity",
        [helper.make_tensor_value_info(name, elem_type, shape)],
        [helper.make_tensor_value_info(out, elem_type, shape)],
    )
    return _model(graph)


def scale(factor: float = 2.0, n: int = 4, *, name: str = "x", out: str = "y") -> bytes:
    """out = factor * x on [batch, n] FP32: a pipeline step whose answer is easy to check."""
    graph = helper.make_graph(
        [helper.make_node("Mul", [name, "factor"], [out])], "scale",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", n])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["batch", n])],
        [numpy_helper.from_array(np.array(factor, dtype=np.float32), "factor")],
    )
    return _model(graph)


def add(n: int = 4, *, elem_type: int = TensorProto.FLOAT) -> bytes:
    """sum = a + b on [batch, n]: a two-input pipeline step."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["sum"])], "add",
        [helper.make_tensor_value_info("a", elem_type, ["batch", n]),
         helper.make_tensor_value_info("b", elem_type, ["batch", n])],
        [helper.make_tensor_value_info("sum", elem_type, ["batch", n])],
    )
    return _model(graph)


def busy(n_in: int = 64, n_out: int = 10, *, spread: int = 2048, layers: int = 8,
         seed: int = 0) -> bytes:
    """Same signature as `mlp()` (x [batch, n_in] -> y [batch, n_out]) but slow by computation,
    not by weight size: each row is spread over `spread` positions and pushed through `layers`
    n_in x n_in dense layers (spread * layers * n_in^2 multiply-adds per row) with a few KB of
    weights. A clearly slower candidate for latency specs that stays small on disk."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(np.array([1, spread, 1], dtype=np.int64), "repeats"),
             numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
             numpy_helper.from_array(np.full((1, spread), 1 / spread, np.float32), "mean"),
             numpy_helper.from_array(np.array([-1, n_in], dtype=np.int64), "flat")]
    nodes = [helper.make_node("Unsqueeze", ["x", "axis1"], ["x3"]),
             helper.make_node("Tile", ["x3", "repeats"], ["h0"])]
    for i in range(layers):
        w = (rng.standard_normal((n_in, n_in)) / np.sqrt(n_in)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [helper.make_node("MatMul", [f"h{i}", f"w{i}"], [f"m{i}"]),
                  helper.make_node("Relu", [f"m{i}"], [f"h{i + 1}"])]
    head = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
    inits.append(numpy_helper.from_array(head, "head"))
    nodes += [helper.make_node("MatMul", ["mean", f"h{layers}"], ["pooled"]),
              helper.make_node("Reshape", ["pooled", "flat"], ["p"]),
              helper.make_node("MatMul", ["p", "head"], ["y"])]
    graph = helper.make_graph(
        nodes, "busy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", n_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", n_out])],
        inits,
    )
    return _model(graph)
