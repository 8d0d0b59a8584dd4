"""Reads. Views and the serving source call these; none of them writes."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Count, OuterRef, Prefetch, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from registry.errors import NotFound
from registry.models import (
    Alias,
    AuditEvent,
    Endpoint,
    Job,
    ModelVersion,
    RegisteredModel,
    ReplicaHeartbeat,
)


def model_list() -> QuerySet[RegisteredModel]:
    """Models with their version count and latest version/status, via per-row correlated
    subqueries: the database evaluates them only for the rows of the page it returns, where a
    GROUP BY over every version costs ~150 ms at 1,000 models x 20 versions."""
    versions = ModelVersion.objects.filter(model=OuterRef("pk")).order_by()
    latest = versions.order_by("-number")
    count = versions.values("model").annotate(n=Count("pk")).values("n")[:1]
    return (RegisteredModel.objects
            .select_related("owner", "endpoint__stable", "endpoint__candidate")
            .annotate(version_count=Coalesce(Subquery(count), 0),
                      latest_version=Subquery(latest.values("number")[:1]),
                      latest_status=Subquery(latest.values("status")[:1]))
            .order_by("name"))


def model_get(name: str) -> RegisteredModel:
    model = model_list().filter(name=name).first()
    if model is None:
        raise NotFound(f"model {name!r} does not exist", field="model")
    return model


def version_list(model: RegisteredModel) -> QuerySet[ModelVersion]:
    return (model.versions.select_related("created_by", "model")
            .prefetch_related(Prefetch("aliases", queryset=Alias.objects.only("name", "version"))))


def version_get(model_name: str, number: int) -> ModelVersion:
    version = (ModelVersion.objects.select_related("model", "created_by")
               .filter(model__name=model_name, number=number).first())
    if version is None:
        model_get(model_name)
        raise NotFound(f"model {model_name!r} has no version {number}", field="version")
    return version


def alias_list(model: RegisteredModel) -> QuerySet[Alias]:
    return model.aliases.select_related("version")


def endpoint_get(model: RegisteredModel) -> Endpoint | None:
    return (Endpoint.objects.select_related("stable", "candidate", "blue", "green", "shadow")
            .filter(model=model).first())


def audit_list() -> QuerySet[AuditEvent]:
    return AuditEvent.objects.all()


def replicas(*, include_stale: bool = False) -> list[ReplicaHeartbeat]:
    qs = ReplicaHeartbeat.objects.all()
    if not include_stale:
        cutoff = timezone.now() - timedelta(seconds=settings.REPLICA_STALE_SECONDS)
        qs = qs.filter(last_seen__gte=cutoff)
    return list(qs)


def job_list(*, kind: str = "", status: str = "", model: str = "") -> QuerySet[Job]:
    """Jobs, newest first, narrowed by kind, status and model name (blank = any)."""
    qs = Job.objects.select_related("version__model", "created_by", "dataset")
    if kind:
        qs = qs.filter(kind=kind)
    if status:
        qs = qs.filter(status=status)
    if model:
        qs = qs.filter(version__model__name=model)
    return qs


def job_get(job_id) -> Job:
    job = job_list().filter(pk=job_id).first()
    if job is None:
        raise NotFound(f"job {job_id} does not exist", field="job")
    return job
