"""TensorRT engine builds: onnxruntime's TensorRT provider builds the engine and writes it to its
engine cache, in a folder keyed by (artifact sha256, GPU model, TensorRT version, precision, shape
profile), so a cached engine is never used on a GPU, TensorRT or profile it was not built for.

The outcome lives on the version, in `validation_report["tensorrt"][precision]`, so the version
detail shows it. On a worker without a CUDA GPU nothing is built and the version keeps serving."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import time
from pathlib import Path

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from serving.runtime import CPU, TENSORRT, OnnxRuntime, gpu_available
from serving.signature import batch_dimension

from .artifacts import default_store
from .audit import Actor, record
from .models import ModelVersion, VersionStatus

log = logging.getLogger(__name__)
PRECISIONS = ("fp32", "fp16")
NO_GPU = "no CUDA GPU on this worker: engine not built; the version keeps serving on CPU"
QUEUED, BUILDING, BUILT, FAILED, SKIPPED = "queued", "building", "built", "failed", "skipped"


@functools.cache
def gpu_model() -> str:
    """The first CUDA device's name from the driver (e.g. "NVIDIA H100 80GB HBM3")."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        if lib.cuInit(0) != 0:
            return "unknown"
        device = ctypes.c_int(0)
        if lib.cuDeviceGet(ctypes.byref(device), 0) != 0:
            return "unknown"
        name = ctypes.create_string_buffer(256)
        if lib.cuDeviceGetName(name, 256, device) != 0:
            return "unknown"
        return name.value.decode(errors="replace")
    except (OSError, AttributeError):
        return "unknown"


@functools.cache
def tensorrt_version() -> str:
    """The TensorRT library onnxruntime's provider will load (python package, else libnvinfer)."""
    try:
        import tensorrt

        return str(tensorrt.__version__)
    except ImportError:
        pass
    for soname in ("libnvinfer.so.10", "libnvinfer.so"):
        try:
            v = ctypes.CDLL(soname).getInferLibVersion()
        except (OSError, AttributeError):
            continue
        return f"{v // 10000}.{v // 100 % 100}.{v % 100}" if v >= 10000 else \
            f"{v // 1000}.{v // 100 % 10}.{v % 100}"
    return "unknown"


def shape_profile(signature: dict, max_batch_size: int) -> dict | None:
    """TensorRT optimisation profile (min/opt/max per input) covering batch 1..max_batch_size;
    None when an input has a dynamic dimension other than the batch (TensorRT then builds for
    the shapes it meets)."""
    mbs = max_batch_size if batch_dimension(signature) else 0
    shapes: dict[str, list[list[int]]] = {}
    for spec in signature.get("inputs", []):
        dims = list(spec.get("shape") or [])
        rest = dims[1:] if mbs else dims
        if any(d < 0 for d in rest):
            return None
        if mbs:
            shapes[spec["name"]] = [[1, *rest], [mbs, *rest], [mbs, *rest]]
        else:
            shapes[spec["name"]] = [rest, rest, rest]

    def fmt(i: int) -> str:
        return ",".join(f"{name}:{'x'.join(map(str, s[i]))}" for name, s in shapes.items())

    return {"trt_profile_min_shapes": fmt(0), "trt_profile_opt_shapes": fmt(1),
            "trt_profile_max_shapes": fmt(2)}


def cache_key(*, sha256: str, gpu: str, trt: str, precision: str, profile: dict | None) -> str:
    parts = [sha256, gpu, trt, precision, repr(sorted((profile or {}).items()))]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def cache_dir(sha256: str, key: str) -> Path:
    return Path(settings.TRT_CACHE_DIR) / sha256[:16] / key


class _EngineBuild(OnnxRuntime):
    """OnnxRuntime asking TensorRT for an explicit shape profile."""

    def __init__(self, *args, profile: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.profile = profile

    def _provider_entry(self, name: str):
        entry = super()._provider_entry(name)
        if name == TENSORRT and self.profile:
            return (name, {**entry[1], **self.profile})
        return entry


def save_status(version_id: int, precision: str, entry: dict) -> None:
    """Write one precision's build status into the version's report (row-locked)."""
    version = ModelVersion.objects.select_for_update().get(pk=version_id)
    report = dict(version.validation_report or {})
    builds = dict(report.get("tensorrt") or {})
    builds[precision] = entry
    report["tensorrt"] = builds
    version.validation_report = report
    version.save(update_fields=["validation_report"])


def _finish(version: ModelVersion, precision: str, entry: dict) -> dict:
    entry["finished_at"] = timezone.now().isoformat()
    with transaction.atomic():
        save_status(version.pk, precision, entry)
        record(Actor.system("tensorrt"), f"version.tensorrt.{entry['status']}",
               target_type="version", target=f"{version.model.name}:{version.number}",
               model_name=version.model.name, after={"precision": precision, **entry})
    return entry


def build_engine(version_id: int, precision: str) -> dict:
    """Build (or find cached) the TensorRT engine of a ready version; returns the status entry."""
    version = ModelVersion.objects.select_related("model").get(pk=version_id)
    entry = dict(((version.validation_report or {}).get("tensorrt") or {}).get(precision) or {})
    entry.update(precision=precision, started_at=timezone.now().isoformat(), message="")
    if version.status != VersionStatus.READY:
        return _finish(version, precision, {**entry, "status": FAILED,
                                            "message": f"version is {version.status}, not ready"})
    if not gpu_available():
        return _finish(version, precision, {**entry, "status": SKIPPED, "message": NO_GPU,
                                            "serving_on": "CPUExecutionProvider"})
    mbs = version.max_batch_size if batch_dimension(version.signature) else 0
    profile = shape_profile(version.signature, mbs)
    gpu, trt = gpu_model(), tensorrt_version()
    key = cache_key(sha256=version.sha256, gpu=gpu, trt=trt, precision=precision,
                    profile=profile)
    folder = cache_dir(version.sha256, key)
    entry.update(status=BUILDING, gpu=gpu, tensorrt=trt, cache_key=key, cache_dir=str(folder),
                 profile=profile)
    with transaction.atomic():
        save_status(version.pk, precision, entry)
    started = time.perf_counter()
    runtime = _EngineBuild(str(default_store().path_for(version.sha256)),
                           providers=[TENSORRT, CPU], trt_cache_dir=folder,
                           trt_fp16=precision == "fp16", profile=profile,
                           graph_optimization_level=version.graph_optimization_level)
    try:
        runtime.load()
        if runtime.providers[:1] != [TENSORRT]:
            raise RuntimeError("the TensorRT provider did not start: "
                               + "; ".join(runtime.load_errors))
        runtime.warmup(version.signature, batch_sizes=(1, mbs) if mbs > 1 else (1,))
    except Exception as exc:
        log.warning("TensorRT build of %s failed: %s", version, exc)
        entry.update(status=FAILED, message=f"{exc}"[:2000] + " (the version keeps serving "
                     "on its current providers)")
    else:
        engines = sorted(p.name for p in folder.glob("*.engine"))
        entry.update(status=BUILT if engines else FAILED, engines=engines,
                     message="" if engines else "TensorRT ran but wrote no engine file")
    finally:
        runtime.unload()
    entry["build_seconds"] = round(time.perf_counter() - started, 3)
    return _finish(version, precision, entry)


@shared_task(name="registry.build_tensorrt_engine", acks_late=True)
def build_tensorrt_task(version_id: int, precision: str) -> str:
    return build_engine(version_id, precision)["status"]
