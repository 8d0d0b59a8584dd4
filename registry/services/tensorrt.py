"""Ask for a TensorRT engine build of a ready version (engineer); the build runs as a job."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from registry.audit import Actor, record
from registry.background import enqueue
from registry.errors import InvalidRequest, LifecycleError
from registry.integrations.tensorrt import BUILDING, PRECISIONS, QUEUED, save_status
from registry.models import ModelVersion
from registry.selectors import ready_version
from registry.services.catalog import lock_model


def tensorrt_build(*, model_name: str, number: int, precision: str,
                   actor: Actor) -> ModelVersion:
    """Queue an engine build for (version, precision). A build already queued or running is
    not queued twice, unless it has been silent longer than a worker's task lease."""
    if precision not in PRECISIONS:
        raise InvalidRequest(f"precision must be one of {', '.join(PRECISIONS)}",
                             field="precision")
    with transaction.atomic():
        model = lock_model(model_name, allow_archived=True)
        version = ModelVersion.objects.select_for_update().get(
            pk=ready_version(model, number).pk)
        if version.pipeline is not None:
            raise LifecycleError(f"{model_name}:{number} is a pipeline: build engines for its "
                                 "steps' versions", field="version")
        current = ((version.validation_report or {}).get("tensorrt") or {}).get(precision) or {}
        since = parse_datetime(current.get("requested_at") or "")
        lease = timedelta(seconds=getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}).get(
            "visibility_timeout", 600))
        if current.get("status") in (QUEUED, BUILDING) and since and (
                timezone.now() - since < lease):
            raise LifecycleError(f"a {precision} TensorRT build of {model_name}:{number} is "
                                 f"already {current['status']}")
        entry = {"status": QUEUED, "precision": precision,
                 "requested_at": timezone.now().isoformat(), "requested_by": actor.name}
        save_status(version.pk, precision, entry)
        record(actor, "version.tensorrt.requested", target_type="version",
               target=f"{model_name}:{number}", model_name=model_name, before=current or None,
               after=entry)
        enqueue("registry.build_tensorrt_engine", version_id=version.pk, precision=precision)
    version.refresh_from_db()
    return version
