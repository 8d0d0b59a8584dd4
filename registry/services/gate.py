"""One gate where routing changes (DESIGN.md, trust boundaries, third wave): a version takes
traffic - stable, a canary candidate's weight, a blue-green slot, shadow, the `production` alias,
a step of a pipeline that does - only while selectors.traffic_refusal finds nothing against it
(ready and, where its model requires approval, approved).

Endpoint changes are checked once, where every one is saved (deployments.commit_change), on the
versions the change gives traffic they did not have (Routing.entrances); the production alias
and a pipeline's steps are checked here too, by alias_set and pipeline_create. A refusal is a 409
naming the version, its state and the role, and listing the versions that may take it."""

from __future__ import annotations

from registry import selectors
from registry.errors import LifecycleError
from registry.models import ModelVersion, RegisteredModel
from registry.routing import Routing

PRODUCTION_ALIAS = "production"


class TrafficRefused(LifecycleError):
    """The version may not take the role it was given (409)."""

    def __init__(self, version: ModelVersion, role: str, refusal: selectors.TrafficRefusal):
        model = version.model
        super().__init__(
            f"version {version.number} of {model.name!r} {refusal.why}: it cannot {role}"
            + (f" — {refusal.hint}" if refusal.hint else ""),
            field="version",
            details={"rule": refusal.rule, "version": version.number, "state": refusal.state,
                     "role": role, "may_take_traffic": [
                         v.number for v in selectors.traffic_versions(model)]})


def refusal(version: ModelVersion, *, role: str) -> TrafficRefused | None:
    """The refusal `version` would get for `role`, or None when it may take it."""
    found = selectors.traffic_refusal(version)
    return None if found is None else TrafficRefused(version, role, found)


def admit(version: ModelVersion, *, role: str) -> None:
    """Refuse (409) to give `version` the role `role` ("become stable") unless it may."""
    refused = refusal(version, role=role)
    if refused is not None:
        raise refused


def admit_routing(model: RegisteredModel, before: Routing[int], after: Routing[int]) -> None:
    """Refuse an endpoint change that gives traffic to a version that may not take it. An
    unload-first rollback's target is admitted when the rollback starts: refused at its second
    half, the endpoint would be left serving nothing."""
    for version_id, role in after.entrances(before):
        admit(ModelVersion.objects.select_related("model").get(pk=version_id), role=role)
    pending = after.rollout.pending_rollback
    if pending and pending != before.rollout.pending_rollback:
        version = model.versions.get(number=pending.version)
        version.model = model
        admit(version, role="become stable")
