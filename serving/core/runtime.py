"""The onnxruntime model runtime: provider selection (TensorRT → CUDA → CPU), session creation
with fallback, prediction, warm-up from a v2 signature.

onnxruntime is imported lazily so the control plane can import this module (for
`select_providers`, `example_inputs`) without paying for it. Nothing here knows HTTP or Django.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from serving.core.dtypes import NUMPY_DTYPES
from serving.core.errors import InvalidInput
from serving.core.gpu import gpu_available

TENSORRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
_GPU_PROVIDERS = (TENSORRT, CUDA)

# onnxruntime's type strings -> v2 datatype.
_ORT_TO_V2 = {
    "tensor(bool)": "BOOL", "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32", "tensor(uint64)": "UINT64", "tensor(int8)": "INT8",
    "tensor(int16)": "INT16", "tensor(int32)": "INT32", "tensor(int64)": "INT64",
    "tensor(float16)": "FP16", "tensor(float)": "FP32", "tensor(double)": "FP64",
    "tensor(bfloat16)": "BF16", "tensor(string)": "BYTES",
}
_OPT_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
               "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


def select_providers(pinned: Sequence[str] | None = None) -> list[str]:
    """Providers to ask for, best first: TensorRT → CUDA (only with a GPU) → CPU.

    `pinned` restricts the choice (e.g. a version validated on CUDA only); CPU always closes the
    list because onnxruntime runs any node a GPU provider cannot on it anyway.
    """
    wanted = list(pinned) if pinned else [TENSORRT, CUDA, CPU]
    gpu = any(p in _GPU_PROVIDERS for p in wanted) and gpu_available()
    chosen = [p for p in _GPU_PROVIDERS if p in wanted and gpu]
    chosen += [p for p in wanted if p not in _GPU_PROVIDERS and p != CPU and p not in chosen]
    chosen.append(CPU)
    return chosen


def _dims(shape: Any, batch: int) -> list[int]:
    """Concrete dims for a signature shape: dynamic (-1, None, a name) → batch first, else 1."""
    if shape is None:
        return [batch]
    out = []
    for i, d in enumerate(shape):
        if isinstance(d, int) and d >= 0:
            out.append(d)
        else:
            out.append(batch if i == 0 else 1)
    return out


def example_inputs(signature: dict, batch: int = 1) -> dict[str, np.ndarray]:
    """Zero-valued inputs matching a v2 signature, for warm-up and smoke tests.

    Zeros (and b"x" for BYTES) because they are valid for index-like inputs (embeddings,
    gathers) where random values would not be.
    """
    feeds: dict[str, np.ndarray] = {}
    for spec in signature.get("inputs", []):
        dtype = spec.get("datatype", "FP32")
        dims = _dims(spec.get("shape"), batch)
        if dtype == "BYTES":
            feeds[spec["name"]] = np.full(dims, b"x", dtype=object)
        elif dtype in NUMPY_DTYPES:
            feeds[spec["name"]] = np.zeros(dims, dtype=NUMPY_DTYPES[dtype])
        else:
            raise ValueError(f"input {spec['name']!r}: datatype {dtype} has no numpy type")
    return feeds


def _to_str(a: np.ndarray, name: str = "") -> np.ndarray:
    """onnxruntime takes string tensors as str and str()s bytes (b'x' becomes "b'x'"); bytes
    that are not UTF-8 cannot be a string tensor, which is the sender's error (InvalidInput)."""
    try:
        flat = [v.decode("utf-8") if isinstance(v, bytes | bytearray) else v for v in a.ravel()]
    except UnicodeDecodeError:
        bad = next(i for i, v in enumerate(a.ravel()) if isinstance(v, bytes | bytearray)
                   and not _is_utf8(v))
        raise InvalidInput(f"input '{name}': BYTES element {bad} is not valid UTF-8 (the "
                           "model takes text)") from None
    return np.array(flat, dtype=object).reshape(a.shape)


def _is_utf8(raw: bytes | bytearray) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _to_bytes(a: np.ndarray) -> np.ndarray:
    """String outputs back to bytes: v2 BYTES are bytes, whatever onnxruntime hands back."""
    flat = [v.encode("utf-8") if isinstance(v, str) else v for v in a.ravel()]
    return np.array(flat, dtype=object).reshape(a.shape)


class OnnxRuntime:
    """One model version on onnxruntime: load() once, predict() from any thread, unload().

    `instance_count` > 1 on a GPU creates that many sessions used round-robin (one session's
    runs share a CUDA stream); on CPU one session serves concurrent runs, which onnxruntime
    allows, so more sessions would only cost memory.
    """

    def __init__(
        self,
        path_or_bytes: str | os.PathLike | bytes,
        *,
        providers: Sequence[str] | None = None,
        intra_op_threads: int = 0,
        graph_optimization_level: str = "all",
        trt_cache_dir: str | os.PathLike | None = None,
        trt_fp16: bool = False,
        trt_profile: dict | None = None,
        instance_count: int = 1,
        allow_spinning: bool = False,
    ) -> None:
        if graph_optimization_level not in _OPT_LEVELS:
            raise ValueError(f"graph_optimization_level {graph_optimization_level!r} is not one "
                             f"of {sorted(_OPT_LEVELS)}")
        self._model = path_or_bytes if isinstance(path_or_bytes, bytes) else os.fspath(
            path_or_bytes)
        self.requested_providers = list(providers) if providers else select_providers()
        self.intra_op_threads = intra_op_threads
        self.graph_optimization_level = graph_optimization_level
        self.trt_cache_dir = os.fspath(trt_cache_dir) if trt_cache_dir else None
        self.trt_fp16 = trt_fp16
        self.trt_profile = trt_profile  # explicit min/opt/max shapes (serving.core.trt_cache)
        self.instance_count = max(1, instance_count)
        self.allow_spinning = allow_spinning
        self.providers: list[str] = []
        self.load_seconds: float | None = None
        self.load_errors: list[str] = []  # why a provider was dropped, for the validation report
        self.input_meta: list[dict] = []
        self.output_meta: list[dict] = []
        self._sessions: list[Any] = []
        self._next = None
        self._output_names: list[str] = []
        self._string_inputs: frozenset[str] = frozenset()
        self._string_outputs: frozenset[str] = frozenset()
        self._run_options = None

    # -- lifecycle -------------------------------------------------------------------------

    def _session_options(self):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(
            ort.GraphOptimizationLevel, _OPT_LEVELS[self.graph_optimization_level])
        so.intra_op_num_threads = self.intra_op_threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # Spinning threads burn a core waiting for work; on a small box that core is the one
        # the HTTP stack needs. Off unless asked.
        so.add_session_config_entry("session.intra_op.allow_spinning",
                                    "1" if self.allow_spinning else "0")
        so.log_severity_level = 3
        # No CPU arena: it keeps the peak of every run for good (a 400 MB answer left RSS
        # 1.1 GB higher; shrinkage at the end of a run cannot free the outputs still in use),
        # while plain malloc gives large blocks back at once. Paired runs measured the cost
        # within noise: MLP batch 1 and 32 about 1 %, the conv net at batch 8 about 4 %.
        so.enable_cpu_mem_arena = False
        return so

    @staticmethod
    def _make_run_options():
        import onnxruntime as ort

        ro = ort.RunOptions()
        # A run that fails raises, and the data plane answers for it (a 400 for what the
        # request chose, logged as a fault otherwise): onnxruntime's own line would let any
        # client write to the log at will.
        ro.log_severity_level = 4
        return ro

    def _provider_entry(self, name: str) -> str | tuple[str, dict]:
        if name == TENSORRT:
            opts: dict[str, Any] = {"trt_fp16_enable": bool(self.trt_fp16)}
            if self.trt_cache_dir:
                os.makedirs(self.trt_cache_dir, exist_ok=True)
                opts.update(
                    trt_engine_cache_enable=True, trt_engine_cache_path=self.trt_cache_dir,
                    trt_timing_cache_enable=True, trt_timing_cache_path=self.trt_cache_dir)
            if self.trt_profile:
                opts.update(self.trt_profile)
            return (name, opts)
        return name

    def _create(self, providers: list[str]):
        import onnxruntime as ort

        return ort.InferenceSession(
            self._model, sess_options=self._session_options(),
            providers=[self._provider_entry(p) for p in providers],
            # Our own fallback below records why; onnxruntime's prints to stdout, and its
            # run-time fallback would switch providers behind the reported list.
            enable_fallback=0)

    def load(self) -> OnnxRuntime:
        """Create the session(s); when a provider fails at creation, retry without it.

        `providers` afterwards says what really runs (session.get_providers()), which can be
        less than asked: onnxruntime falls back to CPU on its own when CUDA libraries are missing.
        """
        started = time.perf_counter()
        remaining = list(self.requested_providers)
        if CPU not in remaining:
            remaining.append(CPU)
        while True:
            try:
                first = self._create(remaining)
                break
            except Exception as exc:  # onnxruntime raises bare RuntimeError/Fail variants
                if len(remaining) == 1:
                    raise
                self.load_errors.append(f"{remaining[0]}: {exc}".strip()[:500])
                remaining = remaining[1:]
        self.providers = list(first.get_providers())
        for asked in remaining:
            if asked not in self.providers:
                self.load_errors.append(f"{asked}: asked for but not used by onnxruntime")
        n = self.instance_count if self.providers[0] != CPU else 1
        self._sessions = [first] + [self._create(self.providers) for _ in range(n - 1)]
        self._next = itertools.cycle(self._sessions).__next__
        self._run_options = self._make_run_options()
        self.input_meta = [_meta(i) for i in first.get_inputs()]
        self.output_meta = [_meta(o) for o in first.get_outputs()]
        self._output_names = [m["name"] for m in self.output_meta]
        self._string_inputs = frozenset(m["name"] for m in self.input_meta
                                        if m["datatype"] == "BYTES")
        self._string_outputs = frozenset(m["name"] for m in self.output_meta
                                         if m["datatype"] == "BYTES")
        self.load_seconds = time.perf_counter() - started
        return self

    @property
    def loaded(self) -> bool:
        """Whether load() succeeded and unload() has not been called."""
        return bool(self._sessions)

    def unload(self) -> None:
        """Drop the sessions; their memory (host and device) goes with the last reference."""
        self._sessions = []
        self._next = None

    # -- inference -------------------------------------------------------------------------

    def text_inputs(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`inputs` with every string input's bytes decoded as onnxruntime needs them; an
        element that is not UTF-8 is an InvalidInput naming it. The data plane calls this per
        request before batching, so one bad request cannot fail the batch it would join."""
        if not self._string_inputs:
            return inputs
        return {k: (_to_str(v, k) if k in self._string_inputs and v.dtype == object else v)
                for k, v in inputs.items()}

    def predict(
        self, inputs: dict[str, np.ndarray], output_names: list[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run the model once; safe to call from several threads at the same time."""
        if self._next is None:
            raise RuntimeError("model is not loaded")
        if self._string_inputs:
            inputs = self.text_inputs(inputs)
        names = output_names or self._output_names
        results = self._next().run(names, inputs, self._run_options)
        out = dict(zip(names, results, strict=True))
        if self._string_outputs:
            for k in self._string_outputs.intersection(out):
                out[k] = _to_bytes(out[k])
        return out

    def warmup(self, signature: dict | None = None, *, batch_sizes: Sequence[int] = (1,)) -> float:
        """Run the model on example inputs (per batch size) so the first real request does not
        pay for lazy allocations or TensorRT engine builds; returns the seconds it took."""
        sig = signature or {"inputs": self.input_meta, "outputs": self.output_meta}
        started = time.perf_counter()
        for b in batch_sizes:
            feeds = example_inputs(sig, batch=b)
            if self._string_inputs:
                feeds = {k: (_to_str(v) if k in self._string_inputs else v)
                         for k, v in feeds.items()}
            for session in self._sessions:
                session.run(None, feeds)
        return time.perf_counter() - started

    def metadata(self) -> dict:
        """Inputs, outputs and providers as the v2 metadata and the validation report show."""
        return {"inputs": self.input_meta, "outputs": self.output_meta,
                "providers": self.providers, "load_seconds": self.load_seconds}


def _meta(arg: Any) -> dict:
    """onnxruntime NodeArg → v2 {"name","datatype","shape"} with -1 for dynamic dims."""
    shape = arg.shape
    dims = [d if isinstance(d, int) and d >= 0 else -1 for d in shape] if shape is not None else []
    return {"name": arg.name, "datatype": _ORT_TO_V2.get(arg.type, arg.type), "shape": dims}
