"""The onnxruntime runtime: which providers really run, prediction, warm-up for every datatype."""

from __future__ import annotations

import threading

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto

from registry import samples
from serving.core.runtime import (
    CPU,
    CUDA,
    TENSORRT,
    OnnxRuntime,
    example_inputs,
    gpu_available,
    select_providers,
)

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not gpu_available(), reason="no CUDA GPU on this machine")
no_gpu = pytest.mark.skipif(gpu_available(), reason="this machine has a GPU")


@pytest.fixture(scope="module")
def mlp_bytes() -> bytes:
    return samples.mlp()


def test_gpu_available_answers_a_bool_and_is_cached():
    assert isinstance(gpu_available(), bool)
    assert gpu_available() is gpu_available()


@no_gpu
def test_without_a_gpu_only_cpu_is_selected_even_though_onnxruntime_lists_gpu_providers():
    assert select_providers() == [CPU]
    assert select_providers([TENSORRT, CUDA]) == [CPU]


@needs_gpu
@gpu
def test_with_a_gpu_providers_are_tried_tensorrt_then_cuda_then_cpu():
    assert select_providers() == [TENSORRT, CUDA, CPU]
    assert select_providers([CUDA]) == [CUDA, CPU]


def test_pinned_providers_restrict_the_choice_and_cpu_always_closes_the_list():
    assert select_providers([CPU]) == [CPU]
    assert select_providers([CUDA, CPU])[-1] == CPU


def test_providers_reported_are_the_ones_the_session_really_uses(mlp_bytes):
    rt = OnnxRuntime(mlp_bytes, providers=[TENSORRT, CUDA, CPU]).load()
    plain = ort.InferenceSession(mlp_bytes, providers=rt.providers)
    assert rt.providers == plain.get_providers()
    if not gpu_available():
        assert rt.providers == [CPU]
        # The validation report says why the GPU providers were dropped.
        assert any(e.startswith(TENSORRT) for e in rt.load_errors)
        assert any(e.startswith(CUDA) for e in rt.load_errors)
    assert rt.load_seconds is not None and rt.load_seconds > 0


def test_predict_gives_what_onnxruntime_gives_directly(mlp_bytes):
    rt = OnnxRuntime(mlp_bytes, intra_op_threads=1).load()
    x = np.random.default_rng(1).standard_normal((5, 64)).astype(np.float32)
    expected = ort.InferenceSession(mlp_bytes, providers=[CPU]).run(None, {"x": x})[0]
    out = rt.predict({"x": x})
    assert list(out) == ["y"]
    np.testing.assert_allclose(out["y"], expected, rtol=1e-5, atol=1e-6)
    assert list(rt.predict({"x": x}, ["y"])) == ["y"]


def test_a_model_loads_from_a_file_path(tmp_path, mlp_bytes):
    path = tmp_path / "model.onnx"
    path.write_bytes(mlp_bytes)
    rt = OnnxRuntime(path).load()
    assert rt.predict({"x": np.zeros((1, 64), np.float32)})["y"].shape == (1, 10)


def test_signature_is_reported_in_v2_terms_with_minus_one_for_dynamic_dims(mlp_bytes):
    rt = OnnxRuntime(mlp_bytes).load()
    assert rt.input_meta == [{"name": "x", "datatype": "FP32", "shape": [-1, 64]}]
    assert rt.output_meta == [{"name": "y", "datatype": "FP32", "shape": [-1, 10]}]


@pytest.mark.parametrize(
    ("elem_type", "datatype", "dtype"),
    [
        (TensorProto.FLOAT, "FP32", np.float32),
        (TensorProto.INT64, "INT64", np.int64),
        (TensorProto.STRING, "BYTES", object),
        (TensorProto.BOOL, "BOOL", np.bool_),
        (TensorProto.FLOAT16, "FP16", np.float16),
        (TensorProto.UINT8, "UINT8", np.uint8),
    ],
)
def test_warmup_works_for_every_datatype(elem_type, datatype, dtype):
    rt = OnnxRuntime(samples.identity(elem_type, ["batch", 3])).load()
    signature = {"inputs": [{"name": "x", "datatype": datatype, "shape": [-1, 3]}],
                 "outputs": [{"name": "y", "datatype": datatype, "shape": [-1, 3]}]}
    assert rt.input_meta == signature["inputs"]
    seconds = rt.warmup(signature)
    assert seconds > 0
    assert rt.warmup(signature, batch_sizes=(1, 4)) > 0
    feeds = example_inputs(signature, batch=2)
    assert feeds["x"].dtype == np.dtype(dtype) and feeds["x"].shape == (2, 3)
    out = rt.predict(feeds)["y"]
    assert out.shape == (2, 3) and out.dtype == np.dtype(dtype)


def test_bytes_go_in_and_come_out_as_bytes_not_as_their_repr():
    rt = OnnxRuntime(samples.identity(TensorProto.STRING, ["batch"])).load()
    x = np.array([b"hello", "žluť".encode(), b""], dtype=object)
    out = rt.predict({"x": x})["y"]
    assert out.tolist() == [b"hello", "žluť".encode(), b""]


def test_example_inputs_use_the_batch_for_a_dynamic_first_dim_and_one_elsewhere():
    sig = {"inputs": [{"name": "a", "datatype": "FP32", "shape": [-1, 64]},
                      {"name": "b", "datatype": "INT64", "shape": [-1, -1, 7]},
                      {"name": "c", "datatype": "BYTES", "shape": [2]}]}
    feeds = example_inputs(sig, batch=8)
    assert feeds["a"].shape == (8, 64) and feeds["a"].dtype == np.float32
    assert feeds["b"].shape == (8, 1, 7) and feeds["b"].dtype == np.int64
    assert feeds["c"].tolist() == [b"x", b"x"]
    with pytest.raises(ValueError, match="BF16"):
        example_inputs({"inputs": [{"name": "z", "datatype": "BF16", "shape": [1]}]})


def test_predict_refuses_before_load_and_after_unload(mlp_bytes):
    rt = OnnxRuntime(mlp_bytes)
    with pytest.raises(RuntimeError, match="not loaded"):
        rt.predict({"x": np.zeros((1, 64), np.float32)})
    rt.load()
    assert rt.loaded
    rt.unload()
    assert not rt.loaded
    with pytest.raises(RuntimeError, match="not loaded"):
        rt.predict({"x": np.zeros((1, 64), np.float32)})


def test_an_unknown_optimisation_level_is_refused_with_the_allowed_ones(mlp_bytes):
    with pytest.raises(ValueError, match="extended"):
        OnnxRuntime(mlp_bytes, graph_optimization_level="max")


@pytest.mark.parametrize("level", ["disable", "basic", "extended", "all"])
def test_every_optimisation_level_gives_the_same_answer(mlp_bytes, level):
    x = np.ones((2, 64), np.float32)
    ref = OnnxRuntime(mlp_bytes).load().predict({"x": x})["y"]
    out = OnnxRuntime(mlp_bytes, graph_optimization_level=level, intra_op_threads=1).load()
    np.testing.assert_allclose(out.predict({"x": x})["y"], ref, rtol=1e-5, atol=1e-6)


def test_predict_is_safe_from_several_threads_at_once(mlp_bytes):
    rt = OnnxRuntime(mlp_bytes, intra_op_threads=1, instance_count=2).load()
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((3, 64)).astype(np.float32) for _ in range(8)]
    expected = [rt.predict({"x": x})["y"] for x in xs]
    results: dict[int, np.ndarray] = {}

    def call(i: int) -> None:
        for _ in range(20):
            results[i] = rt.predict({"x": xs[i]})["y"]

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(8):
        np.testing.assert_array_equal(results[i], expected[i])


@gpu
@needs_gpu
def test_on_a_gpu_the_model_runs_on_a_gpu_provider(mlp_bytes):
    rt = OnnxRuntime(mlp_bytes, providers=[CUDA, CPU]).load()
    assert rt.providers[0] == CUDA, rt.load_errors
    x = np.ones((4, 64), np.float32)
    ref = OnnxRuntime(mlp_bytes, providers=[CPU]).load().predict({"x": x})["y"]
    np.testing.assert_allclose(rt.predict({"x": x})["y"], ref, rtol=1e-3, atol=1e-4)


@gpu
@needs_gpu
def test_tensorrt_writes_its_engine_cache_or_says_why_it_fell_back(tmp_path, mlp_bytes):
    rt = OnnxRuntime(mlp_bytes, trt_cache_dir=tmp_path, trt_fp16=True).load()
    rt.warmup({"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 64]}]})
    if rt.providers[0] == TENSORRT:
        assert any(tmp_path.iterdir()), "TensorRT ran but wrote no engine/timing cache"
    else:
        assert any(e.startswith(TENSORRT) for e in rt.load_errors)
