"""Endpoint state changes and the one state machine every endpoint change goes through: lock the
model and endpoint, check the endpoint's state allows the operation, change, admit the versions
the change gives traffic (the one gate, gate.py), audit, bump revision. Rollout operations
(canary, promote, rollback, blue-green, shadow) live in rollouts.py."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from registry.audit import Actor, record
from registry.errors import LifecycleError, NotFound
from registry.models import Endpoint, ModelVersion, RegisteredModel
from registry.notify import bump_revision
from registry.routing import (
    ANALYSING,
    BLUE_GREEN,
    CANARY,
    EMPTY,
    STABLE,
    STATES,
    UNLOADING,
    Routing,
)
from registry.services.catalog import lock_model
from registry.services.gate import admit_routing

# Which states allow which operation. Shadow is orthogonal to the traffic split.
ALLOWED: dict[str, frozenset[str]] = {
    "deploy": frozenset({EMPTY, STABLE}),
    "undeploy": frozenset({STABLE}),
    "canary": frozenset({STABLE}),
    "weight": frozenset({CANARY}),
    "promote": frozenset({CANARY, ANALYSING}),
    "abort": frozenset({CANARY, ANALYSING}),
    "pause": frozenset({ANALYSING}),
    "resume": frozenset({CANARY}),
    "rollback": frozenset({STABLE}),
    "bg-deploy": frozenset({STABLE, BLUE_GREEN}),
    "switch": frozenset({BLUE_GREEN}),
    "switch-back": frozenset({BLUE_GREEN}),
    "bg-finish": frozenset({BLUE_GREEN}),
    "shadow-start": frozenset({STABLE, CANARY, ANALYSING, BLUE_GREEN}),
    "shadow-stop": frozenset({STABLE, CANARY, ANALYSING, BLUE_GREEN, EMPTY}),
    # Driven by the system, not offered to users as such:
    "advance": frozenset({ANALYSING}),          # the analysis moves to its next step
    "hold": frozenset({ANALYSING}),             # ... or may not promote (approval pending)
    "rollback-load": frozenset({UNLOADING}),    # second half of an unload-first rollback
    "expire-warm": frozenset(STATES),           # drop versions whose grace period is over
    "withdraw": frozenset(STATES),              # a rejected version loses what traffic it had
}
HINTS = {
    EMPTY: "deploy a version first",
    CANARY: "promote or abort the canary first",
    ANALYSING: "pause the analysis, or promote or abort the canary first",
    BLUE_GREEN: "switch or finish the blue-green rollout first",
    UNLOADING: "wait for the unload-first rollback to finish",
    STABLE: "start a canary or a blue-green rollout first",
}


def endpoint_state(ep: Endpoint) -> str:
    return ep.routing.state


class TransitionRefused(LifecycleError):
    """The endpoint's state forbids the operation (409); names the state and the way out."""

    def __init__(self, op: str, state: str, model_name: str):
        super().__init__(f"cannot {op} endpoint {model_name!r}: it is in state '{state}' "
                         f"({HINTS.get(state, '')})", details={"state": state, "operation": op})
        self.state = state


def endpoint_for_update(model: RegisteredModel) -> Endpoint:
    """The model's endpoint row, created on first use, locked for this transaction."""
    Endpoint.objects.get_or_create(model=model)
    return Endpoint.objects.select_for_update().get(model=model)


def endpoint_snapshot(ep: Endpoint) -> dict:
    def num(version_id):
        if version_id is None:
            return None
        return ModelVersion.objects.values_list("number", flat=True).get(pk=version_id)

    routing = ep.routing
    return {
        "state": routing.state, "live": num(routing.live),
        "stable": num(ep.stable_id), "candidate": num(ep.candidate_id),
        "candidate_weight": ep.candidate_weight, "blue": num(ep.blue_id),
        "green": num(ep.green_id), "live_color": ep.live_color or None,
        "shadow": num(ep.shadow_id), "revision": ep.revision,
    }


def keep_warm(ep: Endpoint, version_id: int | None) -> None:
    """Keep a version that just lost its traffic loaded for the grace period."""
    now = timezone.now()
    if ep.warm_until and ep.warm_until < now:
        ep.warm_versions = []
    if version_id and version_id not in ep.warm_versions:
        ep.warm_versions = [*ep.warm_versions, version_id]
    ep.warm_until = now + timedelta(seconds=settings.WARM_GRACE_SECONDS)


def version_of(model: RegisteredModel, number: int) -> ModelVersion:
    """Version `number` of `model` (NotFound if none). Whether it may take the role it is given
    is the gate's to say, when the change is committed."""
    version = model.versions.filter(number=number).first()
    if version is None:
        raise NotFound(f"model {model.name!r} has no version {number}", field="version")
    version.model = model
    return version


def commit_change(ep: Endpoint, *, routed: Routing[int], actor: Actor, action: str,
                  before: dict, reason: str = "", details: dict | None = None) -> Endpoint:
    """Save an endpoint's new routing: the one place every routing change passes, so the one
    gate (a version takes traffic only if it may) is here. `routed`: the routing before."""
    admit_routing(ep.model, routed, ep.routing)
    ep.revision = bump_revision()
    ep.save()
    after = endpoint_snapshot(ep)
    if details:
        after["details"] = details
    record(actor, action, target_type="endpoint", target=ep.model.name, model_name=ep.model.name,
           before=before, after=after, reason=reason)
    return ep


def record_refusal(*, model_name: str, op: str, actor: Actor, error: LifecycleError,
                   reason: str = "") -> None:
    """A refused transition is audited too, in its own transaction (the change rolled back)."""
    with transaction.atomic():
        record(actor, f"endpoint.{op}.refused", target_type="endpoint", target=model_name,
               model_name=model_name, after={"error": error.message, "details": error.details},
               reason=reason)


Change = Callable[[Endpoint, RegisteredModel], "dict | None"]


def transition(op: str, *, model_name: str, actor: Actor, change: Change, reason: str = "",
               action: str | None = None, allow_archived: bool = False) -> Endpoint:
    """Run one state-machine transition: lock, check the state, change, commit_change.
    `change` mutates the locked endpoint and may return details for the audit event."""
    try:
        with transaction.atomic():
            model = lock_model(model_name, allow_archived=allow_archived)
            ep = endpoint_for_update(model)
            state = endpoint_state(ep)
            if state not in ALLOWED[op]:
                raise TransitionRefused(op, state, model_name)
            before, routed = endpoint_snapshot(ep), ep.routing
            details = change(ep, model)
            return commit_change(ep, routed=routed, actor=actor,
                                 action=action or f"endpoint.{op}", before=before, reason=reason,
                                 details=details)
    except LifecycleError as exc:
        if _model_exists(model_name):
            record_refusal(model_name=model_name, op=op, actor=actor, error=exc, reason=reason)
        raise


def _model_exists(name: str) -> bool:
    return RegisteredModel.objects.filter(name=name).exists()


def endpoint_deploy(*, model_name: str, version_number: int | None, actor: Actor,
                    reason: str = "") -> Endpoint:
    """Point the endpoint's stable at a version (None: stop serving the model)."""
    if version_number is None:
        def undeploy(ep: Endpoint, model: RegisteredModel) -> None:
            ep.stable = ep.shadow = None
            ep.warm_versions, ep.warm_until = [], None

        return transition("undeploy", model_name=model_name, actor=actor, change=undeploy,
                          reason=reason, allow_archived=True)

    def deploy(ep: Endpoint, model: RegisteredModel) -> None:
        version = version_of(model, version_number)
        if ep.stable_id == version.pk:
            raise LifecycleError(f"version {version_number} is already stable on {model_name!r}")
        keep_warm(ep, ep.stable_id)
        ep.stable = version

    return transition("deploy", model_name=model_name, actor=actor, change=deploy, reason=reason)
