"""Rollout operations: canary (weights, promote, abort, automated analysis pause/resume),
rollback, blue-green (deploy to the idle colour, switch, switch back, finish) and shadow.

Each one is a transition of the state machine in deployments.py: one transaction with the endpoint
row locked, refused with a 409 naming the state that forbids it, its versions admitted by the one
gate where routing changes (a version that may not take the traffic it is given: a 409 naming it,
its state and the role), audited (actor, before -> after, reason, the figures or differences it
used), revision + 1, serving notified after commit."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from registry import selectors
from registry.audit import Actor
from registry.choices import RollbackOrder
from registry.convergence import wait_for_revision
from registry.errors import Forbidden, InvalidRequest, LifecycleError
from registry.models import Endpoint, ModelVersion, RegisteredModel, VersionStatus
from registry.roles import may
from registry.routing import ANALYSING, Analysis, AnalysisPlan, BlueGreen, PendingRollback
from registry.services.catalog import lock_model
from registry.services.deployments import (
    commit_change,
    endpoint_for_update,
    endpoint_snapshot,
    endpoint_state,
    keep_warm,
    transition,
    version_of,
)
from registry.services.replicas import replicas_forget
from registry.signatures import signature_differences
from registry.ticks import require_ticking
from serving.core.desired_state import SCALED_TO_ZERO

UNLOAD_WAIT_SECONDS = 30.0


def _weight(weight: int) -> int:
    if isinstance(weight, bool) or not isinstance(weight, int) or not 0 <= weight <= 100:
        raise InvalidRequest("weight must be a whole percentage from 0 to 100", field="weight")
    return weight


def _number(version_id: int | None) -> int | None:
    if version_id is None:
        return None
    return ModelVersion.objects.values_list("number", flat=True).get(pk=version_id)


# ------------------------------------------------------------------------------------ canary


def canary_start(*, model_name: str, version_number: int, weight: int = 0, actor: Actor,
                 reason: str = "", override: bool = False, plan: dict | None = None) -> Endpoint:
    """Route `weight` % of unpinned traffic to a candidate whose signature the stable's
    callers can use unchanged. An admin may override incompatibility with a reason (audited).
    With a plan, the automated analysis drives the weights, starting at its first step."""
    _weight(weight)
    plan = AnalysisPlan.clean(plan) if plan is not None else None

    def change(ep: Endpoint, model: RegisteredModel) -> dict:
        version = version_of(model, version_number)
        if version.pk == ep.stable_id:
            raise LifecycleError(f"version {version_number} is already stable on {model_name!r}")
        details: dict = {}
        differences = []
        if version.status == VersionStatus.READY:  # else no signature yet: the gate refuses it
            differences = signature_differences(
                ep.stable.signature or {"inputs": [], "outputs": []},
                version.signature or {"inputs": [], "outputs": []})
        if differences:
            if not override:
                raise LifecycleError(
                    f"version {version_number}'s signature is incompatible with the stable "
                    f"version {ep.stable.number}'s: " + "; ".join(differences),
                    details={"differences": differences})
            if not may(actor.user, ep.model.team_id, "admin"):
                raise Forbidden("overriding a signature incompatibility needs the admin role "
                                "in the model's team")
            if not reason.strip():
                raise InvalidRequest("an override needs a reason", field="reason")
            details["override"] = differences
        ep.candidate, ep.candidate_weight = version, weight
        if plan is not None:
            require_ticking()
            now = timezone.now()
            analysis = Analysis(plan=plan, step=0, started_at=now, step_started_at=now)
            ep.candidate_weight = analysis.weight
            ep.rollout = ep.rollout.with_(analysis=analysis)
            details["plan"] = plan.as_dict()
        return details

    return transition("canary", model_name=model_name, actor=actor, change=change, reason=reason)


def canary_weight(*, model_name: str, weight: int, actor: Actor, reason: str = "") -> Endpoint:
    _weight(weight)

    def change(ep: Endpoint, model: RegisteredModel) -> None:
        if ep.candidate_weight == weight:
            raise LifecycleError(f"the candidate already takes {weight} %")
        ep.candidate_weight = weight

    return transition("weight", model_name=model_name, actor=actor, change=change, reason=reason)


def _end_canary(ep: Endpoint) -> None:
    ep.candidate, ep.candidate_weight = None, 0
    ep.rollout = ep.rollout.with_(analysis=None)


def canary_promote(*, model_name: str, actor: Actor, reason: str = "",
                   details: dict | None = None) -> Endpoint:
    """The candidate becomes stable; the old stable stays warm for the grace period, so a
    rollback to it is instant."""

    def change(ep: Endpoint, model: RegisteredModel) -> dict | None:
        keep_warm(ep, ep.stable_id)
        ep.stable_id = ep.candidate_id
        _end_canary(ep)
        return details

    return transition("promote", model_name=model_name, actor=actor, change=change, reason=reason)


def canary_abort(*, model_name: str, actor: Actor, reason: str = "",
                 details: dict | None = None) -> Endpoint:
    """Drop the candidate (all traffic back to stable); it stays warm briefly."""

    def change(ep: Endpoint, model: RegisteredModel) -> dict | None:
        keep_warm(ep, ep.candidate_id)
        _end_canary(ep)
        return details

    return transition("abort", model_name=model_name, actor=actor, change=change, reason=reason)


def analysis_pause(*, model_name: str, actor: Actor, reason: str = "") -> Endpoint:
    def change(ep: Endpoint, model: RegisteredModel) -> None:
        ep.rollout = ep.rollout.with_(analysis=replace(ep.rollout.analysis, paused=True))

    return transition("pause", model_name=model_name, actor=actor, change=change, reason=reason)


def analysis_resume(*, model_name: str, actor: Actor, reason: str = "") -> Endpoint:
    """Resume at the step where it paused: its weight again, and a fresh bake time."""

    def change(ep: Endpoint, model: RegisteredModel) -> None:
        analysis = ep.rollout.analysis
        if not analysis:
            raise LifecycleError(f"the canary on {model_name!r} has no analysis plan to resume; "
                                 f"start the canary with a plan")
        require_ticking()
        ep.candidate_weight = analysis.weight
        ep.rollout = ep.rollout.with_(analysis=replace(
            analysis, paused=False, step_started_at=timezone.now()))

    return transition("resume", model_name=model_name, actor=actor, change=change, reason=reason)


def analysis_advance(*, model_name: str, from_step: int, actor: Actor, reason: str = "",
                     details: dict | None = None) -> Endpoint:
    """The analysis found the current step healthy: next step's weight, fresh bake time.
    `from_step` guards against two ticks advancing the same step twice."""

    def change(ep: Endpoint, model: RegisteredModel) -> dict | None:
        analysis = ep.rollout.analysis
        if analysis.step != from_step:
            raise LifecycleError(f"the analysis of {model_name!r} is at step "
                                 f"{analysis.step}, not {from_step}")
        analysis = replace(analysis, step=from_step + 1, step_started_at=timezone.now())
        ep.candidate_weight = analysis.weight
        ep.rollout = ep.rollout.with_(analysis=analysis)
        return details

    return transition("advance", model_name=model_name, actor=actor, change=change,
                      reason=reason, action="endpoint.analysis.advance")


def analysis_hold(*, model_name: str, why: str, actor: Actor,
                  details: dict | None = None) -> Endpoint:
    """The analysis would promote, but a rule forbids it (the candidate awaits approval): it
    holds at its last step and remembers why, so the refusal is audited once, not every tick."""

    def change(ep: Endpoint, model: RegisteredModel) -> dict | None:
        ep.rollout = ep.rollout.with_(analysis=replace(ep.rollout.analysis, held=why))
        return details

    return transition("hold", model_name=model_name, actor=actor, change=change, reason=why,
                      action="endpoint.analysis.hold")


def analysis_stale(*, model_name: str, why: str, actor: Actor) -> Endpoint | None:
    """Nothing has judged the candidate for too long (analysis_watch): its weight drops to 0
    and the analysis pauses, at its step, until someone resumes it once the tick runs again.
    None when the endpoint is no longer analysing (another process dropped it first): no
    refusal is audited for that."""
    with transaction.atomic():
        model = lock_model(model_name, allow_archived=True)
        ep = endpoint_for_update(model)
        if endpoint_state(ep) != ANALYSING:
            return None
        before, routed = endpoint_snapshot(ep), ep.routing
        ep.candidate_weight = 0
        ep.rollout = ep.rollout.with_(analysis=replace(ep.rollout.analysis, paused=True))
        return commit_change(ep, routed=routed, actor=actor, action="endpoint.analysis.stale",
                             before=before, reason=f"{why}: the candidate takes no traffic "
                             "until the analysis is resumed")


# ---------------------------------------------------------------------------------- rollback


def rollback(*, model_name: str, version_number: int, actor: Actor, reason: str = "",
             order: str = RollbackOrder.LOAD_FIRST) -> Endpoint:
    """Point stable at an earlier version (one that may take traffic: the gate).

    load-first (default): one revision; replicas load and warm the target before they switch and
    unload the old stable only after, so nothing fails (it stays warm for the grace period).
    unload-first (memory-short machines): two revisions; the old stable is unloaded everywhere
    first, and until the target is loaded unpinned requests get 503 - a visible gap."""
    if order not in RollbackOrder.values:
        raise InvalidRequest(f"order must be one of {', '.join(RollbackOrder.values)}",
                             field="order")

    def target(ep: Endpoint, model: RegisteredModel) -> ModelVersion:
        version = version_of(model, version_number)
        current = ep.stable.number
        if version.number >= current:
            raise LifecycleError(f"rollback goes to an earlier version: {version_number} is not "
                                 f"earlier than the stable {current} (use deploy)")
        return version

    if order == RollbackOrder.LOAD_FIRST:
        def change(ep: Endpoint, model: RegisteredModel) -> dict:
            version = target(ep, model)
            keep_warm(ep, ep.stable_id)
            ep.stable = version
            return {"order": order}

        return transition("rollback", model_name=model_name, actor=actor, change=change,
                          reason=reason)

    def unload(ep: Endpoint, model: RegisteredModel) -> dict:
        version = target(ep, model)
        ep.rollout = ep.rollout.with_(pending_rollback=PendingRollback(
            version=version.number, since=timezone.now()))
        ep.stable = None
        ep.warm_versions, ep.warm_until = [], None
        return {"order": order, "phase": "unload"}

    ep = transition("rollback", model_name=model_name, actor=actor, change=unload, reason=reason)
    wait_for_revision(ep.revision, UNLOAD_WAIT_SECONDS)
    return rollback_complete(model_name=model_name, actor=actor, reason=reason)


def rollback_complete(*, model_name: str, actor: Actor, reason: str = "") -> Endpoint:
    """Second half of an unload-first rollback (also run by the periodic job after a crash)."""

    def load(ep: Endpoint, model: RegisteredModel) -> dict:
        pending = ep.rollout.pending_rollback
        ep.rollout = ep.rollout.with_(pending_rollback=None)
        ep.stable = version_of(model, pending.version)
        return {"order": RollbackOrder.UNLOAD_FIRST.value, "phase": "load"}

    return transition("rollback-load", model_name=model_name, actor=actor, change=load,
                      reason=reason, action="endpoint.rollback")


# -------------------------------------------------------------------------------- blue-green


def bluegreen_deploy(*, model_name: str, version_number: int, actor: Actor,
                     reason: str = "") -> Endpoint:
    """Put a version in the idle colour: replicas load and warm it, no traffic moves.
    From a plain stable, the stable becomes the live blue slot and the version goes to green."""

    def change(ep: Endpoint, model: RegisteredModel) -> dict:
        version = version_of(model, version_number)
        if not ep.live_color:
            ep.blue, ep.live_color = ep.stable, "blue"
        routing = ep.routing
        if routing.live == version.pk:
            raise LifecycleError(f"version {version_number} is already live "
                                 f"({routing.live_color})")
        setattr(ep, routing.idle_color, version)
        ep.rollout = ep.rollout.with_(blue_green=BlueGreen(deployed_at=timezone.now()))
        return {"color": routing.idle_color}

    return transition("bg-deploy", model_name=model_name, actor=actor, change=change,
                      reason=reason)


def idle_laggards(model_name: str, version_number: int) -> list[dict]:
    """Live replicas on which the version is not loaded and warmed (heartbeat state READY), or
    scaled to zero there (a request loads it: the endpoint chose cold starts)."""
    key = f"{model_name}:{version_number}"
    out = []
    for r in selectors.replicas():
        state = (r.versions or {}).get(key, {}).get("state")
        if state not in ("READY", SCALED_TO_ZERO):
            out.append({"replica": r.replica, "state": state or "not loaded"})
    return out


def _switch(op: str, *, model_name: str, actor: Actor, reason: str) -> Endpoint:
    def change(ep: Endpoint, model: RegisteredModel) -> dict:
        routing = ep.routing
        live, idle = routing.live_color, routing.idle_color
        bg = ep.rollout.blue_green or BlueGreen(deployed_at=timezone.now())
        if op == "switch" and bg.switched_at:
            raise LifecycleError(f"the idle colour ({idle}) holds the version just switched "
                                 f"away from; use switch-back, or deploy a new version to it")
        if op == "switch-back" and not bg.switched_at:
            raise LifecycleError(f"there is no switch to go back from on {model_name!r}")
        target = getattr(ep, idle)
        if target is None:
            raise LifecycleError(f"the idle colour ({idle}) has no version; deploy to it first")
        behind = idle_laggards(model_name, target.number)
        if behind:
            raise LifecycleError(
                f"version {target.number} ({idle}) is not loaded and warmed on every live "
                f"replica: " + ", ".join(f"{b['replica']} ({b['state']})" for b in behind),
                details={"laggards": behind})
        ep.live_color, ep.stable = idle, target
        now = timezone.now()
        bg = (replace(bg, switched_at=now, switched_from=live) if op == "switch"
              else replace(bg, switched_at=None, switched_back_at=now))
        ep.rollout = ep.rollout.with_(blue_green=bg)
        return {"from": live, "to": idle}

    return transition(op, model_name=model_name, actor=actor, change=change, reason=reason)


def bluegreen_switch(*, model_name: str, actor: Actor, reason: str = "") -> Endpoint:
    """All unpinned traffic to the idle colour at once (one revision). The old colour stays
    loaded, so switch-back is instant, until finish (by hand or after the grace period)."""
    return _switch("switch", model_name=model_name, actor=actor, reason=reason)


def bluegreen_switch_back(*, model_name: str, actor: Actor, reason: str = "") -> Endpoint:
    return _switch("switch-back", model_name=model_name, actor=actor, reason=reason)


def bluegreen_finish(*, model_name: str, actor: Actor, reason: str = "",
                     keep_idle_warm: bool = True) -> Endpoint:
    """Leave blue-green: the live version is the plain stable; the idle colour is dropped (kept
    warm for the grace period when finished by hand)."""

    def change(ep: Endpoint, model: RegisteredModel) -> dict:
        idle_id = ep.routing.idle
        if keep_idle_warm:
            keep_warm(ep, idle_id)
        ep.stable = ep.live_version
        ep.blue = ep.green = None
        ep.live_color = ""
        ep.rollout = ep.rollout.with_(blue_green=None)
        return {"dropped": _number(idle_id), "kept_warm": keep_idle_warm}

    return transition("bg-finish", model_name=model_name, actor=actor, change=change,
                      reason=reason)


# ------------------------------------------------------------------------------------ shadow


def shadow_start(*, model_name: str, version_number: int, actor: Actor,
                 reason: str = "") -> Endpoint:
    """Mirror live traffic to a version; its answers are compared, never returned."""

    def change(ep: Endpoint, model: RegisteredModel) -> None:
        version = version_of(model, version_number)
        if ep.routing.live == version.pk:
            raise LifecycleError(f"version {version_number} is the live version; shadow another")
        if ep.shadow_id == version.pk:
            raise LifecycleError(f"version {version_number} is already the shadow")
        ep.shadow = version

    return transition("shadow-start", model_name=model_name, actor=actor, change=change,
                      reason=reason)


def shadow_stop(*, model_name: str, actor: Actor, reason: str = "") -> Endpoint:
    def change(ep: Endpoint, model: RegisteredModel) -> None:
        if ep.shadow_id is None:
            raise LifecycleError(f"endpoint {model_name!r} has no shadow")
        ep.shadow = None

    return transition("shadow-stop", model_name=model_name, actor=actor, change=change,
                      reason=reason)


# ---------------------------------------------------------------------------- housekeeping


def housekeeping(*, actor: Actor | None = None) -> list[str]:
    """What the periodic job does besides the analysis: finish blue-green rollouts whose old
    colour's grace period is over, complete unload-first rollbacks a crash interrupted, drop
    expired warm versions (replicas unload only on a new revision, so expiry must bump one), and
    forget replicas lost for longer than REPLICA_FORGET_SECONDS."""
    actor = actor or Actor.system("rollout-scheduler")
    now = timezone.now()
    grace = timedelta(seconds=settings.WARM_GRACE_SECONDS)
    done = []
    for ep in Endpoint.objects.select_related("model"):
        name, rollout = ep.model.name, ep.rollout
        try:
            switched = rollout.blue_green.switched_at if rollout.blue_green else None
            pending = rollout.pending_rollback
            if ep.live_color and switched and switched + grace <= now:
                bluegreen_finish(model_name=name, actor=actor, keep_idle_warm=False,
                                 reason="the old colour's grace period is over")
                done.append(f"{name}: blue-green finished")
            elif pending and pending.since + timedelta(seconds=2 * UNLOAD_WAIT_SECONDS) <= now:
                rollback_complete(model_name=name, actor=actor,
                                  reason="completing an interrupted unload-first rollback")
                done.append(f"{name}: rollback completed")
            if ep.warm_versions and ep.warm_until and ep.warm_until <= now:
                _expire_warm(name, actor)
                done.append(f"{name}: warm versions dropped")
        except LifecycleError:  # someone changed the endpoint meanwhile: next tick looks again
            continue
    done += [f"replica {name}: forgotten" for name in replicas_forget(actor=actor, now=now)]
    return done


def _expire_warm(model_name: str, actor: Actor) -> Endpoint:
    def change(ep: Endpoint, model: RegisteredModel) -> dict:
        if not ep.warm_versions or not ep.warm_until or ep.warm_until > timezone.now():
            raise LifecycleError("nothing to expire")
        dropped = [_number(pk) for pk in ep.warm_versions]
        ep.warm_versions, ep.warm_until = [], None
        return {"dropped": dropped}

    return transition("expire-warm", model_name=model_name, actor=actor, change=change,
                      reason="grace period over", allow_archived=True)

