"""TensorRT engine builds: asked for through the API, run as a job, recorded on the version. On a
worker without a CUDA GPU the job says so plainly and the version keeps serving on CPU."""

from __future__ import annotations

import time

import pytest
from django.db import transaction

from registry import samples
from registry.integrations.tensorrt import NO_GPU, cache_key, shape_profile
from registry.models import AuditEvent
from serving.core.runtime import gpu_available

pytestmark = pytest.mark.django_db(transaction=True)
needs_gpu = pytest.mark.skipif(not gpu_available(), reason="no CUDA GPU on this machine")
no_gpu = pytest.mark.skipif(gpu_available(), reason="this machine has a GPU")


def wait_build(client, model: str, number: int, precision: str, timeout: float = 300) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        body = client.get(f"/api/v1/models/{model}/versions/{number}/").json()
        entry = body["validation_report"].get("tensorrt", {}).get(precision, {})
        if entry.get("status") not in (None, "queued", "building"):
            return body
        time.sleep(0.1)
    raise AssertionError(f"{model}:{number} TensorRT {precision} build still {entry}")


@no_gpu
def test_without_a_gpu_the_build_says_so_and_the_version_keeps_serving(ready_model, engineer):
    ready_model("fraud", samples.mlp())
    r = engineer.post("/api/v1/models/fraud/versions/1/tensorrt/", {"precision": "fp16"},
                      format="json")
    assert r.status_code == 202, r.content
    assert r.json()["validation_report"]["tensorrt"]["fp16"]["status"] in (
        "queued", "skipped")

    body = wait_build(engineer, "fraud", 1, "fp16")
    entry = body["validation_report"]["tensorrt"]["fp16"]
    assert entry["status"] == "skipped"
    assert entry["message"] == NO_GPU == ("no CUDA GPU on this worker: engine not built; the "
                                          "version keeps serving on CPU")
    assert entry["requested_by"] == "engineer" and entry["finished_at"]
    assert body["status"] == "ready"
    assert body["validation_report"]["providers"] == ["CPUExecutionProvider"]
    assert engineer.post("/api/v1/models/fraud/endpoint/deploy/", {"version": 1},
                         format="json").status_code == 200
    status = engineer.get("/api/v1/models/fraud/versions/1/tensorrt/").json()
    assert status["tensorrt"]["fp16"]["status"] == "skipped"
    assert list(AuditEvent.objects.filter(action__startswith="version.tensorrt").order_by(
        "id").values_list("action", flat=True)) == ["version.tensorrt.requested",
                                                     "version.tensorrt.skipped"]


def test_builds_need_an_engineer_a_known_precision_and_a_ready_version(ready_model, engineer,
                                                                     client_for):
    ready_model("fraud", samples.mlp())
    url = "/api/v1/models/fraud/versions/1/tensorrt/"
    assert client_for("viewer").post(url, {"precision": "fp16"}, format="json"
                                     ).status_code == 403
    assert client_for("viewer").get(url).status_code == 200
    r = engineer.post(url, {"precision": "int8"}, format="json")
    assert r.status_code == 400 and "precision" in r.json()["error"]
    r = engineer.post("/api/v1/models/fraud/versions/9/tensorrt/", {}, format="json")
    assert r.status_code == 404


def test_the_engine_cache_key_separates_gpu_tensorrt_precision_and_profile():
    sig = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 64]}], "outputs": []}
    profile = shape_profile(sig, 32)
    assert profile == {"trt_profile_min_shapes": "x:1x64", "trt_profile_opt_shapes": "x:32x64",
                       "trt_profile_max_shapes": "x:32x64"}
    assert shape_profile({"inputs": [{"name": "x", "shape": [-1, -1]}]}, 8) is None
    base = dict(sha256="a" * 64, gpu="NVIDIA H100", trt="10.3.0", precision="fp16",
                profile=profile)
    key = cache_key(**base)
    assert key == cache_key(**base)
    for change in ({"sha256": "b" * 64}, {"gpu": "NVIDIA A10G"}, {"trt": "10.4.0"},
                   {"precision": "fp32"}, {"profile": shape_profile(sig, 8)}):
        assert cache_key(**{**base, **change}) != key, change


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_on_a_gpu_the_engine_is_built_into_its_keyed_cache(ready_model, engineer, precision):
    from pathlib import Path

    ready_model("fraud", samples.mlp())
    assert engineer.post("/api/v1/models/fraud/versions/1/tensorrt/", {"precision": precision},
                         format="json").status_code == 202
    entry = wait_build(engineer, "fraud", 1, precision)["validation_report"]["tensorrt"][
        precision]
    assert entry["status"] == "built", entry["message"]
    assert entry["engines"] and entry["build_seconds"] > 0
    assert entry["gpu"] != "unknown" and entry["tensorrt"] != "unknown"
    folder = Path(entry["cache_dir"])
    assert folder.name == entry["cache_key"]
    assert all((folder / name).stat().st_size > 0 for name in entry["engines"])


def test_replicas_are_told_the_built_precision_and_the_shared_cache(ready_model, settings):
    """What a replica needs to reuse a build: the registry's spec names the precision of the
    newest built engine and the cache root; both sides compute the same keyed folder."""
    from registry.integrations.tensorrt import save_status
    from registry.models import ModelVersion
    from registry.serving_source import _spec
    from registry.store.artifacts import default_store
    from serving.core.trt_cache import engine_dir

    ready_model("fraud", samples.mlp())
    version = ModelVersion.objects.get(model__name="fraud", number=1)
    spec = _spec(version, default_store())
    assert (spec.trt_precision, spec.trt_cache_root) == ("fp32", str(settings.TRT_CACHE_DIR))
    def save(precision: str, status: str, day: int) -> None:
        with transaction.atomic():
            save_status(version.pk, precision, {"status": status,
                                                "finished_at": f"2026-01-0{day}T00:00:00"})

    save("fp16", "skipped", 2)
    version.refresh_from_db()
    assert _spec(version, default_store()).trt_precision == "fp32"  # nothing built: plain fp32
    save("fp32", "built", 1)
    save("fp16", "built", 3)
    version.refresh_from_db()
    spec = _spec(version, default_store())
    assert spec.trt_precision == "fp16"  # the newest build wins
    replica_side = engine_dir(spec.trt_cache_root, sha256=spec.sha256, precision="fp16",
                              signature=spec.signature,
                              max_batch_size=spec.batching.max_batch_size)
    build_side = engine_dir(settings.TRT_CACHE_DIR, sha256=version.sha256, precision="fp16",
                            signature=version.signature, max_batch_size=version.max_batch_size)
    assert replica_side == build_side


@pytest.mark.gpu
@needs_gpu
def test_a_replica_loads_the_engine_the_build_job_made_instead_of_building(ready_model,
                                                                           engineer):
    from pathlib import Path

    from registry.models import ModelVersion
    from registry.serving_source import _spec
    from registry.store.artifacts import default_store
    from serving.core.reconciler import load_version

    ready_model("fraud", samples.mlp())
    engineer.post("/api/v1/models/fraud/versions/1/tensorrt/", {"precision": "fp16"},
                  format="json")
    entry = wait_build(engineer, "fraud", 1, "fp16")["validation_report"]["tensorrt"]["fp16"]
    assert entry["status"] == "built", entry["message"]
    folder = Path(entry["cache_dir"])
    before = {p.name: p.stat().st_mtime_ns for p in folder.glob("*.engine")}
    spec = _spec(ModelVersion.objects.get(model__name="fraud", number=1), default_store())
    started = time.perf_counter()
    lv = load_version(spec)
    load_seconds = time.perf_counter() - started
    assert lv.runtime.providers[0] == "TensorrtExecutionProvider"
    after = {p.name: p.stat().st_mtime_ns for p in folder.glob("*.engine")}
    assert after == before  # reused, not rebuilt
    print(f"\nbuild {entry['build_seconds']} s, replica load from cache {load_seconds:.3f} s")
