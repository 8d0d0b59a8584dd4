"""Deleting versions and models (archiving only hides them). A version goes only while nothing
holds it: no role on its endpoint (stable, canary candidate, a blue-green slot, shadow, kept warm,
a pending rollback's target), no pipeline step, no alias, no queued or running job, no validation
in progress. A model goes with its versions when none of them is held from outside it (its own
aliases and pipelines go with it).

The rows go in one transaction with the audit event that names what was removed (numbers,
sha256s); the blobs stay for the garbage collector (store/gc.py), which removes one only when no
version, of any model, references it any more. Version numbers are never given out again
(catalog.next_version_number): metrics, caches and the audit log name versions by number."""

from __future__ import annotations

import shutil
from collections import defaultdict
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from registry.audit import Actor, record
from registry.errors import LifecycleError, NotFound
from registry.models import (
    Alias,
    AuditEvent,
    ConfigSearch,
    Endpoint,
    Job,
    MetricSample,
    ModelVersion,
    RegisteredModel,
    VersionStatus,
)
from registry.notify import bump_revision
from registry.routing import Routing
from registry.services.catalog import lock_model
from registry.services.loadtests import ACTIVE
from registry.store.files import job_dir

VALIDATING = (VersionStatus.UPLOADED, VersionStatus.VALIDATING)


@dataclass(frozen=True)
class Hold:
    """One thing that keeps a version from being deleted, worded after "version 3 of 'fraud'":
    "is the canary candidate of its endpoint". `own`: it belongs to the version's model (an
    alias, a pipeline of the same model) and is deleted with the model."""

    why: str
    own: bool = False


def _routing_holds(ep: Endpoint, ids: dict[int, int]) -> list[tuple[int, Hold]]:
    """(version number, hold) for every role the endpoint's routing gives a version."""
    routing: Routing[int] = Routing.of(ep, now=timezone.now())  # warm only while it lasts
    # in blue-green the stable column follows the live slot: that slot is what to name
    stable = None if routing.live_color and routing.stable == routing.live else routing.stable
    slots = [(stable, "is the stable version of its endpoint"),
             (routing.candidate, "is the canary candidate of its endpoint")]
    for color in ("blue", "green"):
        state = ("live " if color == routing.live_color
                 else "idle " if routing.live_color else "")
        slots.append((getattr(routing, color), f"is the {state}{color} slot of its endpoint"))
    slots.append((routing.shadow, "is the shadow of its endpoint"))
    until = f" until {ep.warm_until:%Y-%m-%d %H:%M} UTC" if ep.warm_until else ""
    slots += [(pk, f"is kept warm for an instant rollback{until}") for pk in routing.warm]
    out = [(ids[pk], Hold(why)) for pk, why in slots if pk is not None and pk in ids]
    if routing.rollout.pending_rollback:
        out.append((routing.rollout.pending_rollback.version,
                    Hold("is the target of its endpoint's pending rollback")))
    return out


def version_holds(model: RegisteredModel) -> dict[int, list[Hold]]:
    """Version number -> what holds it, for every held version of `model` (a version not in the
    answer may be deleted). Read by the delete services and by the version page."""
    versions = list(model.versions.only("pk", "number", "status"))
    ids = {v.pk: v.number for v in versions}
    found: list[tuple[int, Hold]] = []
    endpoint = Endpoint.objects.filter(model=model).first()
    if endpoint is not None:
        found += _routing_holds(endpoint, ids)
    for pipeline in (ModelVersion.objects.filter(pipeline__isnull=False)
                     .select_related("model").only("number", "pipeline", "model__name")):
        for step in pipeline.pipeline.get("steps", []):
            if step.get("model") == model.name:
                found.append((step["version"], Hold(
                    f"is step {step['name']!r} of pipeline {pipeline.model.name!r} "
                    f"v{pipeline.number}", own=pipeline.model.name == model.name)))
    for name, pk in Alias.objects.filter(model=model).values_list("name", "version_id"):
        found.append((ids[pk], Hold(f"is the target of alias {name!r}", own=True)))
    for job in Job.objects.filter(version__model=model, status__in=ACTIVE).select_related(
            "version").order_by("created_at"):
        found.append((job.version.number, Hold(
            f"has a {job.get_kind_display().lower()} job {job.status} ({job.pk}); wait for it "
            f"or cancel it")))
    for search in ConfigSearch.objects.filter(version__model=model, status__in=ACTIVE
                                              ).select_related("version"):
        found.append((search.version.number, Hold(
            f"has a config search {search.status} ({search.pk}); wait for it or cancel it")))
    found += [(v.number, Hold("is still being validated")) for v in versions
              if v.status in VALIDATING]
    holds: dict[int, list[Hold]] = defaultdict(list)
    for number, hold in found:
        if hold not in holds[number]:
            holds[number].append(hold)
    return dict(holds)


def _refusal(model: RegisteredModel, number: int, holds: list[Hold]) -> str:
    return (f"version {number} of {model.name!r} " + "; ".join(h.why for h in holds)
            + ": it cannot be deleted")


def deletion_refusal(model: RegisteredModel, number: int) -> str:
    """Why version `number` cannot be deleted now ("" when it can), as the 409 says it."""
    holds = version_holds(model).get(number)
    return _refusal(model, number, holds) if holds else ""


def _model_holds(model: RegisteredModel) -> list[str]:
    """What keeps the model from being deleted: holds on its versions from outside it."""
    return [f"version {n} " + "; ".join(h.why for h in hs if not h.own)
            for n, hs in sorted(version_holds(model).items()) if any(not h.own for h in hs)]


def model_deletion_refusal(model: RegisteredModel) -> str:
    """Why the model cannot be deleted now ("" when it can), as the 409 says it."""
    held = _model_holds(model)
    return f"model {model.name!r} cannot be deleted: " + "; ".join(held) if held else ""


def _removed(versions: list[ModelVersion]) -> list[dict]:
    return [{"number": v.number, "sha256": v.sha256, "size_bytes": v.size_bytes,
             "status": v.status, "filename": v.original_filename} for v in versions]


def _blobs(versions: list[ModelVersion]) -> dict[str, str]:
    """Each removed sha256 -> what becomes of its blob: kept while another version shares it,
    else collected by the next garbage collection."""
    gone = {v.pk for v in versions}
    out = {}
    for sha in sorted({v.sha256 for v in versions}):
        other = (ModelVersion.objects.filter(sha256=sha).exclude(pk__in=gone)
                 .select_related("model").order_by("model__name", "number").first())
        out[sha] = (f"kept: version {other.number} of {other.model.name!r} shares it" if other
                    else "unreferenced: removed by the next garbage collection")
    return out


def _delete_rows(model: RegisteredModel, versions: list[ModelVersion]) -> int:
    """The versions' rows and what only they own: finished jobs (and their files, once
    committed), approval decisions, metric history. Returns the number of jobs removed."""
    jobs = list(Job.objects.filter(version__in=versions).values_list("pk", flat=True))
    Job.objects.filter(pk__in=jobs).delete()
    MetricSample.objects.filter(model_name=model.name,
                                version__in=[v.number for v in versions]).delete()
    ModelVersion.objects.filter(pk__in=[v.pk for v in versions]).delete()
    for pk in jobs:
        transaction.on_commit(lambda pk=pk: shutil.rmtree(job_dir(pk), ignore_errors=True))
    return len(jobs)


def version_delete(*, model_name: str, number: int, actor: Actor,
                   reason: str = "") -> AuditEvent:
    """Delete a version nothing holds (409 naming every hold otherwise); returns the audit
    event, which says what was removed."""
    with transaction.atomic():
        model = lock_model(model_name, allow_archived=True)
        version = model.versions.select_for_update().filter(number=number).first()
        if version is None:
            raise NotFound(f"model {model_name!r} has no version {number}", field="version")
        holds = version_holds(model).get(number)
        if holds:
            raise LifecycleError(_refusal(model, number, holds), field="version",
                                 details={"rule": "in-use", "holds": [h.why for h in holds]})
        endpoint = Endpoint.objects.select_for_update().filter(model=model).first()
        if endpoint is not None and version.pk in (endpoint.warm_versions or []):
            # its warm grace is over; its id must not name a later version
            endpoint.warm_versions = [pk for pk in endpoint.warm_versions if pk != version.pk]
            endpoint.save(update_fields=["warm_versions", "updated_at"])
        blobs = _blobs([version])
        jobs = _delete_rows(model, [version])
        event = record(actor, "version.delete", target_type="version",
                       target=f"{model_name}:{number}", model_name=model_name, reason=reason,
                       before={**_removed([version])[0], "jobs": jobs,
                               "blob": blobs[version.sha256]})
        bump_revision()  # replicas let go of anything they still had loaded for it
    return event


def model_delete(*, name: str, actor: Actor, reason: str = "") -> AuditEvent:
    """Delete a model with all its versions, aliases, endpoint (keys, limits) and webhooks,
    when none of its versions is held from outside it (409 naming each hold otherwise);
    returns the audit event, which says what was removed."""
    with transaction.atomic():
        model = lock_model(name, allow_archived=True)
        held = _model_holds(model)
        if held:
            raise LifecycleError(f"model {name!r} cannot be deleted: " + "; ".join(held),
                                 field="model", details={"rule": "in-use", "holds": held})
        versions = list(model.versions.select_for_update().order_by("number"))
        aliases = dict(Alias.objects.filter(model=model).values_list("name", "version__number"))
        blobs = _blobs(versions)
        Alias.objects.filter(model=model).delete()
        Endpoint.objects.filter(model=model).delete()  # its keys go with it
        jobs = _delete_rows(model, versions)
        webhooks = model.webhooks.count()
        model.delete()
        event = record(actor, "model.delete", target_type="model", target=name,
                       model_name=name, reason=reason, before={
                           "name": name, "description": model.description, "tags": model.tags,
                           "versions": _removed(versions), "aliases": aliases, "jobs": jobs,
                           "webhooks": webhooks, "blobs": blobs})
        bump_revision()
    return event
