"""TensorRT engine builds: onnxruntime's TensorRT provider builds the engine and writes it to its
engine cache, in a folder keyed by (artifact sha256, GPU model, TensorRT version, precision, shape
profile), so a cached engine is never used on a GPU, TensorRT or profile it was not built for.

The outcome lives on the version, in `validation_report["tensorrt"][precision]`, so the version
detail shows it. On a worker without a CUDA GPU nothing is built and the version keeps serving."""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from registry.audit import Actor, record
from registry.models import ModelVersion, VersionStatus
from registry.store.artifacts import default_store
from serving.core.runtime import CPU, TENSORRT, OnnxRuntime, gpu_available
from serving.core.tensor_signature import batch_dimension
from serving.core.trt_cache import (  # noqa: F401 - re-exported for callers and tests
    PRECISIONS,
    cache_key,
    engine_dir,
    gpu_model,
    shape_profile,
    tensorrt_version,
)

log = logging.getLogger(__name__)
NO_GPU = "no CUDA GPU on this worker: engine not built; the version keeps serving on CPU"
QUEUED, BUILDING, BUILT, FAILED, SKIPPED = "queued", "building", "built", "failed", "skipped"


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
    folder, key, profile = engine_dir(settings.TRT_CACHE_DIR, sha256=version.sha256,
                                      precision=precision, signature=version.signature,
                                      max_batch_size=mbs)
    gpu, trt = gpu_model(), tensorrt_version()
    entry.update(status=BUILDING, gpu=gpu, tensorrt=trt, cache_key=key, cache_dir=str(folder),
                 profile=profile)
    with transaction.atomic():
        save_status(version.pk, precision, entry)
    started = time.perf_counter()
    runtime = OnnxRuntime(str(default_store().local_path(version.sha256)),
                          providers=[TENSORRT, CPU], trt_cache_dir=folder,
                          trt_fp16=precision == "fp16", trt_profile=profile,
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

