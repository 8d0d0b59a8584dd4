"""Desired-state sources that need no database: a Triton-like model repository folder.

    <root>/<model>/<version>/model.onnx
    <root>/<model>/config.json          (optional)

config.json keys (all optional): max_batch_size, preferred_batch_sizes, max_queue_delay_us,
max_queue_size, instance_count, intra_op_threads, max_output_bytes (0: the replica's
default, $MMC_MAX_OUTPUT_BYTES), response_cache (true: answer repeated requests from the
replica's response cache, $MMC_RESPONSE_CACHE_BYTES), trt_precision (fp32|fp16; engines are cached
under $MMC_TRT_CACHE_DIR or <root>/.trt-cache), stable (default: the highest version),
candidate + candidate_weight, shadow, api_key_sha256 (list of hex digests), limits ({rps, burst,
daily_quota}: the endpoint's, serving.core.rate_limits), api_keys (list of {sha256, label, rps,
burst, daily_quota}: keys with a label and limits of their own), scale_to_zero_after_seconds (unload
the model after that long without a request, reload on the next; 0: never), capture ({percent,
mode, max_bytes}: data capture, written under $MMC_CAPTURE_DIR in the artifact store's layout,
capture/<model>/<day>/<hour>/; without that folder capture is off). Every version found
is loaded (pinnable); unpinned traffic goes to the stable (and candidate). Load/unload through
the v2 repository API is not offered: edit the folder (or use the registry).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

import orjson

from serving.core.capture import MODES, CaptureSettings, FolderCaptureSink
from serving.core.desired_state import (
    BatchingConfig,
    DesiredState,
    ModelRoute,
    ObservedState,
    ReadOnlySource,
    VersionSpec,
)
from serving.core.rate_limits import Limits, PredictKey
from serving.core.tensor_signature import DEFAULT_MAX_BATCH_SIZE, batch_dimension

_MODEL_FILE = "model.onnx"


def _flag(config: dict, key: str, model: str) -> bool:
    value = config.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"{model}/config.json: {key} must be true or false, got {value!r}")
    return value


def _version_order(name: str) -> tuple[int, int | str]:
    return (0, int(name)) if name.isdigit() else (1, name)


def _idle_seconds(config: dict, model_dir: Path) -> float:
    value = config.get("scale_to_zero_after_seconds", 0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{model_dir}/config.json: scale_to_zero_after_seconds must be 0 "
                         f"(never) or more seconds, got {value!r}")
    return float(value)


def _capture(doc: dict, model_dir: Path) -> CaptureSettings:
    percent = doc.get("percent", 0)
    mode = doc.get("mode", "both")
    max_bytes = doc.get("max_bytes", CaptureSettings.max_bytes)
    if isinstance(percent, bool) or not isinstance(percent, int | float) \
            or not 0 <= percent <= 100:
        raise ValueError(f"{model_dir}/config.json: capture.percent must be 0 to 100")
    if mode not in MODES:
        raise ValueError(f"{model_dir}/config.json: capture.mode must be one of "
                         f"{', '.join(MODES)}")
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise ValueError(f"{model_dir}/config.json: capture.max_bytes must be a byte count")
    return CaptureSettings(percent=float(percent), mode=mode, max_bytes=max_bytes)


def _limits(doc: dict, model_dir: Path) -> Limits:
    """Limits from config.json (rps, burst, daily_quota; each optional, 0: none)."""
    try:
        limits = Limits(rps=float(doc.get("rps", 0)), burst=int(doc.get("burst", 0)),
                        daily_quota=int(doc.get("daily_quota", 0)))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{model_dir}/config.json: bad limits {doc!r}: {exc}") from None
    if min(limits.rps, limits.burst, limits.daily_quota) < 0:
        raise ValueError(f"{model_dir}/config.json: limits must be 0 (none) or more: {doc!r}")
    return limits


def _keys(docs: list, model_dir: Path) -> dict[str, PredictKey]:
    """config.json's api_keys: [{sha256, label, rps, burst, daily_quota}], by sha256."""
    keys = {}
    for doc in docs:
        if type(doc) is not dict or not isinstance(doc.get("sha256"), str):
            raise ValueError(f"{model_dir}/config.json: each of api_keys needs a sha256 "
                             f"(hex digest of the key), got {doc!r}")
        keys[doc["sha256"]] = PredictKey(str(doc.get("label") or doc["sha256"][:8]),
                                         _limits(doc, model_dir))
    return keys


class RepositorySource(ReadOnlySource):
    """A DesiredStateSource over a folder; its revision is the newest mtime (ns) in the tree,
    so adding a version, editing config.json or replacing a file is a new revision."""

    def __init__(self, path: str | os.PathLike, *, read_signature: Callable[[bytes], dict],
                 intra_op_threads: int = 0) -> None:
        """`read_signature` turns an ONNX file's bytes into its signature (the composition
        root passes registry.signatures.read_signature: serving itself never imports onnx)."""
        self.root = Path(path)
        self.read_signature = read_signature
        self.intra_op_threads = intra_op_threads
        self.observed: ObservedState | None = None  # the last heartbeat, for tests and debugging
        self._cache: dict[tuple[str, int, int], tuple[str, dict]] = {}
        self._lock = threading.Lock()
        capture_dir = os.environ.get("MMC_CAPTURE_DIR") or ""
        if capture_dir:  # offered only with a folder: serving.http.app looks for the method
            self.store_capture = FolderCaptureSink(capture_dir)

    # -- DesiredStateSource ------------------------------------------------------------------

    def revision(self) -> int:
        if not self.root.is_dir():
            raise FileNotFoundError(f"model repository {self.root} does not exist")
        newest = self.root.stat().st_mtime_ns
        for model_dir in self._dirs(self.root):
            newest = max(newest, model_dir.stat().st_mtime_ns)
            for entry in model_dir.iterdir():
                newest = max(newest, entry.stat().st_mtime_ns)
                if entry.is_dir():
                    model_file = entry / _MODEL_FILE
                    if model_file.exists():
                        newest = max(newest, model_file.stat().st_mtime_ns)
        return newest // 1000  # µs: JSON-safe for dashboards, still monotonic

    def fetch(self) -> DesiredState:
        revision = self.revision()
        routes: dict[str, ModelRoute] = {}
        versions: dict[tuple[str, str], VersionSpec] = {}
        for model_dir in self._dirs(self.root):
            model = model_dir.name
            config = self._config(model_dir)
            found = sorted(
                (d.name for d in self._dirs(model_dir) if (d / _MODEL_FILE).is_file()),
                key=_version_order,
            )
            if not found:
                continue
            for version in found:
                versions[(model, version)] = self._spec(model, version, model_dir, config)
            keys = _keys(config.get("api_keys") or [], model_dir)
            stable = str(config.get("stable") or found[-1])
            candidate = config.get("candidate")
            shadow = config.get("shadow")
            referenced = {stable, candidate, shadow} - {None}
            routes[model] = ModelRoute(
                model=model,
                stable=stable,
                candidate=str(candidate) if candidate is not None else None,
                candidate_weight=int(config.get("candidate_weight", 0)),
                shadow=str(shadow) if shadow is not None else None,
                warm=tuple(v for v in found if v not in referenced),
                api_key_hashes=frozenset(config.get("api_key_sha256", ())) | frozenset(keys),
                limits=_limits(config.get("limits") or {}, model_dir),
                keys=keys,
                scale_to_zero_after_s=_idle_seconds(config, model_dir),
                capture=_capture(config.get("capture") or {}, model_dir),
            )
        return DesiredState(revision=revision, routes=routes, versions=versions)

    def report(self, observed: ObservedState) -> None:
        self.observed = observed

    def subscribe(self, callback) -> None:
        """No push channel for a folder: the reconciler's poll notices changes."""

    # -- helpers -----------------------------------------------------------------------------

    @staticmethod
    def _dirs(path: Path) -> list[Path]:
        return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))

    @staticmethod
    def _config(model_dir: Path) -> dict:
        path = model_dir / "config.json"
        if not path.is_file():
            return {}
        try:
            config = orjson.loads(path.read_bytes())
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
        if type(config) is not dict:
            raise ValueError(f"{path}: must hold a JSON object")
        return config

    def _spec(self, model: str, version: str, model_dir: Path, config: dict) -> VersionSpec:
        path = model_dir / version / _MODEL_FILE
        sha256, signature = self._describe(path)
        max_batch = config.get("max_batch_size")
        if max_batch is None:
            max_batch = DEFAULT_MAX_BATCH_SIZE if batch_dimension(signature) else 0
        batching = BatchingConfig(
            max_batch_size=int(max_batch),
            preferred_batch_sizes=tuple(int(b) for b in config.get("preferred_batch_sizes", ())),
            max_queue_delay_us=int(config.get("max_queue_delay_us", 0)),
            max_queue_size=int(config.get("max_queue_size", BatchingConfig.max_queue_size)),
            instance_count=int(config.get("instance_count", 1)),
        )
        return VersionSpec(
            model=model, version=version, artifact_path=str(path), sha256=sha256,
            signature=signature, batching=batching,
            intra_op_threads=int(config.get("intra_op_threads", self.intra_op_threads)),
            trt_precision=str(config.get("trt_precision", "fp32")),
            trt_cache_root=os.environ.get("MMC_TRT_CACHE_DIR") or str(self.root / ".trt-cache"),
            max_output_bytes=int(config.get("max_output_bytes", 0)),
            response_cache=_flag(config, "response_cache", model),
        )

    def _describe(self, path: Path) -> tuple[str, dict]:
        """sha256 and signature of one file, cached by (path, mtime, size): polls stay cheap.

        A file onnx cannot parse gets a signature naming the error, so the reconciler reports
        that version FAILED instead of the whole repository failing."""
        st = path.stat()
        key = (str(path), st.st_mtime_ns, st.st_size)
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None:
            return cached
        data = path.read_bytes()
        sha256 = hashlib.sha256(data).hexdigest()
        try:
            signature = self.read_signature(data)
        except Exception as exc:  # noqa: BLE001 - protobuf/onnx raise many types
            signature = {"inputs": [], "outputs": [], "error": f"cannot read {path}: {exc}"}
        with self._lock:
            self._cache[key] = (sha256, signature)
        return sha256, signature
