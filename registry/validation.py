"""Validation of an uploaded version: checker, signature, runtime compatibility, a real
onnxruntime session and a warm-up inference. Ends in `ready` or `failed` with a reason a person
can act on; never leaves a version in `validating`: the recovery tick queues a lapsed one again."""

from __future__ import annotations

import hashlib
import logging
import time
from datetime import timedelta

import onnx
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from registry.audit import Actor, record
from registry.background import enqueue, every
from registry.errors import without_paths
from registry.models import ModelVersion, VersionStatus
from registry.signatures import (
    extract_signature,
    runtime_compatibility_problem,
    runtime_too_new,
)
from registry.store.artifacts import ArtifactUnavailable, default_store
from serving.core.runtime import OnnxRuntime, select_providers
from serving.core.tensor_signature import DEFAULT_MAX_BATCH_SIZE, batch_dimension

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 3


class ValidationFailed(Exception):
    """Why the version cannot serve; `report` keeps what validation learned before it failed."""

    def __init__(self, reason: str, *, report: dict | None = None):
        super().__init__(reason)
        self.report = report or {}


def weights_sha256(model) -> str:
    """sha256 over the initializers (name, type, shape, data), sorted by name: the same weights
    give the same hash whatever else in the file changed. "" when weights are external."""
    digest = hashlib.sha256()
    for init in sorted(model.graph.initializer, key=lambda t: t.name):
        if init.data_location == onnx.TensorProto.EXTERNAL:
            return ""
        data = init.raw_data or numpy_helper.to_array(init).tobytes()
        digest.update(f"{init.name}\0{init.data_type}\0{list(init.dims)}\0{len(data)}\0"
                      .encode())
        digest.update(data)
    return digest.hexdigest()


def _inspect(path, size: int) -> tuple[dict, dict]:
    """Return (signature, report) or raise ValidationFailed with an actionable reason."""

    if size == 0:
        raise ValidationFailed("the file is empty (0 bytes); upload the .onnx file itself")
    report: dict = {}
    t0 = time.perf_counter()
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise ValidationFailed(f"not an ONNX model: the file does not parse as an ONNX protobuf "
                               f"({exc.__class__.__name__}: {exc}); was it truncated?") from None
    if not model.graph.node and not model.graph.input and not model.graph.output:
        raise ValidationFailed("not an ONNX model: no graph was found in the file")
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as exc:  # checker raises several unrelated types
        raise ValidationFailed(f"ONNX checker rejected the model: {exc}") from None
    report["checker"] = "passed (full_check)"
    problem = runtime_compatibility_problem(model)
    if problem:
        # kept in the report as data: the version page and the CLI offer a conversion from it
        too_new = runtime_too_new(model)
        raise ValidationFailed(problem, report={**report, "runtime_too_new": too_new})
    try:
        signature = extract_signature(model)
    except ValueError as exc:
        raise ValidationFailed(f"unsupported signature: {exc}") from None
    report["weights_sha256"] = weights_sha256(model)
    report["parse_ms"] = round((time.perf_counter() - t0) * 1000, 2)
    runtime = OnnxRuntime(str(path), providers=select_providers(settings.ORT_PROVIDERS or None))
    try:
        runtime.load()
        report["providers"] = list(runtime.providers)
        report["load_ms"] = round(runtime.load_seconds * 1000, 2)
        report["warmup_ms"] = round(runtime.warmup(signature) * 1000, 3)
    except Exception as exc:
        raise ValidationFailed(f"onnxruntime could not run the model: {exc}") from None
    finally:
        runtime.unload()
    return signature, report


def lease() -> timedelta:
    return timedelta(seconds=settings.VALIDATION_LEASE_SECONDS)


def validate_version(version_id: int) -> str:
    """Validate one version; idempotent (a finished version is left alone, one a live worker
    holds too). The worker renews `validation_heartbeat_at` while it works: if it dies, the
    recovery tick sees the lease lapse and queues the version again (attempts counted)."""
    now = timezone.now()
    with transaction.atomic():
        version = ModelVersion.objects.select_for_update(of=("self",)).select_related("model").get(
            pk=version_id)
        if version.status in (VersionStatus.READY, VersionStatus.FAILED):
            return version.status
        if (version.validation_started_at is not None and version.validation_heartbeat_at
                and version.validation_heartbeat_at > now - lease()):
            return version.status  # a live worker is validating it (a duplicate message)
        version.status = VersionStatus.VALIDATING
        version.validation_attempts += 1
        version.validation_started_at = version.validation_heartbeat_at = now
        version.save(update_fields=["status", "validation_attempts", "validation_started_at",
                                    "validation_heartbeat_at"])
        attempts = version.validation_attempts
    signature, report, reason = {}, {}, ""
    if attempts > MAX_ATTEMPTS:
        reason = (f"validation was interrupted {MAX_ATTEMPTS} times (worker killed or timed "
                  f"out); the model may be too large for the worker's memory")
    else:
        store = default_store()
        try:
            if not store.verify(version.sha256):
                raise ValidationFailed("stored artifact is missing or does not match its sha256")
            path = store.local_path(version.sha256)
            with every(lease().total_seconds() / 3, _renew, version_id):
                signature, report = _inspect(path, version.size_bytes)
        except ValidationFailed as exc:
            reason, report = str(exc), exc.report
        except Exception as exc:  # never leave the version in validating
            log.exception("validation of %s crashed", version)
            reason = f"validation crashed: {exc.__class__.__name__}: {exc}"
    with transaction.atomic():
        version = ModelVersion.objects.select_for_update().get(pk=version_id)
        if version.status != VersionStatus.VALIDATING:
            return version.status
        version.validation_report = report
        if reason:
            version.status = VersionStatus.FAILED  # shown to users: no paths of this host
            version.failure_reason = without_paths(reason, settings.ARTIFACT_ROOT)[:4000]
        else:
            version.status, version.failure_reason = VersionStatus.READY, ""
            version.signature = signature
            version.weights_sha256 = report.pop("weights_sha256", "")
            if batch_dimension(signature) and version.max_batch_size == 0:
                version.max_batch_size = DEFAULT_MAX_BATCH_SIZE
        version.save()
        record(Actor.system("validator"),
               "version.ready" if not reason else "version.failed",
               target_type="version", target=f"{version.model.name}:{version.number}",
               model_name=version.model.name,
               after={"status": version.status, "reason": version.failure_reason,
                      "providers": report.get("providers")})
    return version.status


def queue_validation(version_id: int) -> None:
    """Queue the validation after commit; if the broker refuses it, the version is due at the
    recovery tick that follows (not a whole lease later)."""
    enqueue("registry.validate_version", version_id=version_id,
            on_unsent=lambda: ModelVersion.objects.filter(pk=version_id).update(
                validation_heartbeat_at=None))


def _renew(version_id: int) -> None:
    ModelVersion.objects.filter(pk=version_id, status=VersionStatus.VALIDATING).update(
        validation_heartbeat_at=timezone.now())


def stale_validations(older_than: timedelta | None = None):
    """Versions waiting for a validation nobody does: queued (or running) with no sign of life
    for a lease (the message was never sent, or lost with its worker)."""
    cutoff = timezone.now() - (older_than if older_than is not None else lease())
    return ModelVersion.objects.filter(
        Q(validation_heartbeat_at__isnull=True) | Q(validation_heartbeat_at__lt=cutoff),
        status__in=[VersionStatus.UPLOADED, VersionStatus.VALIDATING])


def recover_validations(older_than: timedelta | None = None) -> list[int]:
    """Queue again the validations a dead worker (or a broker that was down when the version was
    uploaded) left behind. Runs at worker start and on the periodic recovery tick. Each is marked
    queued now, so the next tick does not queue it twice; its attempts count when it runs."""
    with transaction.atomic():
        ids = list(stale_validations(older_than).select_for_update(skip_locked=True)
                   .values_list("pk", flat=True))
        ModelVersion.objects.filter(pk__in=ids).update(validation_started_at=None,
                                                       validation_heartbeat_at=timezone.now())
        for pk in ids:
            queue_validation(pk)
    if ids:
        log.warning("re-queued %d validation(s) nobody was doing: %s", len(ids), ids)
    return ids


def backfill_weights_hashes(*, limit: int = 20) -> list[str]:
    """Versions validated before the weights hash existed get it now (read from their stored
    artifact), at most `limit` per call, oldest first, each in its own audited transaction.
    Weights kept outside the file, or an artifact that is not ONNX, are marked so they are not
    read again. Returns the versions filled ("fraud:3")."""
    store = default_store()
    pending = (ModelVersion.objects.select_related("model")
               .filter(status=VersionStatus.READY, weights_sha256="", format="onnx")
               .exclude(validation_report__has_key="weights_unhashable")
               .order_by("pk")[:limit])
    filled = []
    for version in pending:
        try:
            path = store.local_path(version.sha256)  # from an object store: fetched, checked
            digest = weights_sha256(onnx.load(str(path), load_external_data=False))
            why = "" if digest else "weights are stored outside the file"
        except (FileNotFoundError, ArtifactUnavailable):
            continue  # the artifact is gone or the store is down: its health says so; later
        except Exception as exc:  # not parseable as ONNX: mark it, never retry forever
            digest, why = "", f"{exc.__class__.__name__}: {exc}"[:200]
        with transaction.atomic():
            row = ModelVersion.objects.select_for_update().get(pk=version.pk)
            if row.weights_sha256:
                continue
            if digest:
                row.weights_sha256 = digest
                row.save(update_fields=["weights_sha256"])
            else:
                row.validation_report = {**(row.validation_report or {}),
                                         "weights_unhashable": why}
                row.save(update_fields=["validation_report"])
            name = f"{version.model.name}:{version.number}"
            record(Actor.system("backfill"), "version.weights-hash", target_type="version",
                   target=name, model_name=version.model.name,
                   after={"weights_sha256": digest} if digest else {"unhashable": why})
        if digest:
            filled.append(name)
    return filled
