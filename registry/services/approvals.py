"""Approval decisions (as MLflow's and SageMaker's model registries): a model may require that a
version be approved before it takes traffic. An approver or admin of the model's team other than
the uploader (registry.roles) approves or rejects it, with a comment (required to reject); each
decision is kept and audited.

What a decision allows is the one gate's to say (gate.py, checked wherever routing changes).
Rejecting a version that takes traffic ends that traffic in the same transaction, audited: a
canary's candidate is aborted, an idle blue-green slot cleared, a shadow stopped, the production
alias dropped, a warm copy unloaded (it would answer pinned requests), and so for a pipeline that
runs it as a step. A live version (the stable, the live slot, an unload-first rollback's target)
is not rejected: roll back first."""

from __future__ import annotations

from django.db import transaction

from registry import selectors
from registry.audit import Actor, record
from registry.choices import ApprovalState
from registry.errors import Forbidden, InvalidRequest, LifecycleError, NotFound
from registry.models import Alias, ApprovalDecision, Endpoint, ModelVersion, RegisteredModel
from registry.roles import may
from registry.services.catalog import lock_model
from registry.services.deployments import transition
from registry.services.gate import PRODUCTION_ALIAS


def may_decide(user, version: ModelVersion) -> str | None:
    """Why `user` may not approve or reject `version`, or None when they may."""
    if not may(user, version.model.team_id, "approver"):
        return ("approving or rejecting a version needs the approver role in the model's team "
                "(or admin; a global engineer is an approver in the team 'default')")
    if version.created_by_id is not None and version.created_by_id == user.pk:
        return (f"you uploaded version {version.number}; another engineer or admin must "
                f"approve or reject it")
    return None


def _decide(decision: str, *, model_name: str, number: int, actor: Actor,
            comment: str) -> ModelVersion:
    comment = (comment or "").strip()
    if decision == ApprovalState.REJECTED and not comment:
        raise InvalidRequest("a rejection needs a comment saying why", field="comment")
    with transaction.atomic():
        # The model row first, as every routing change locks it: a deploy and a rejection of
        # the same version take turns, so the gate never reads a decision being made.
        model = lock_model(model_name, allow_archived=True)
        try:  # the version row locked: two reviewers deciding at once take turns
            version = model.versions.select_for_update().get(number=number)
        except ModelVersion.DoesNotExist:
            raise NotFound(f"model {model_name!r} has no version {number}",
                           field="version") from None
        refusal = may_decide(actor.user, version)
        if refusal:
            raise Forbidden(refusal)
        if version.approval == decision:
            raise LifecycleError(f"version {number} of {model_name!r} is already {decision}")
        before = {"approval": version.approval}
        version.approval = decision
        version.save(update_fields=["approval"])
        ApprovalDecision.objects.create(version=version, decision=decision, comment=comment,
                                        decided_by=actor.user, decided_by_name=actor.name)
        verb = "approve" if decision == ApprovalState.APPROVED else "reject"
        record(actor, f"version.{verb}", target_type="version", target=str(version),
               model_name=model_name, before=before,
               after={"approval": decision, "version": number, "comment": comment},
               reason=comment)
        if decision == ApprovalState.REJECTED:
            version.model = model
            withdraw_refused(version, actor=actor, reason=f"rejected: {comment}")
    return version


def version_approve(*, model_name: str, number: int, actor: Actor,
                    comment: str = "") -> ModelVersion:
    return _decide(ApprovalState.APPROVED, model_name=model_name, number=number, actor=actor,
                   comment=comment)


def version_reject(*, model_name: str, number: int, actor: Actor,
                   comment: str) -> ModelVersion:
    return _decide(ApprovalState.REJECTED, model_name=model_name, number=number, actor=actor,
                   comment=comment)


def withdraw_refused(version: ModelVersion, *, actor: Actor, reason: str) -> None:
    """End the traffic that `version`, and any pipeline running it as a step, may no longer take
    (the gate refuses it now), within the caller's transaction."""
    if selectors.traffic_refusal(version) is None:
        return
    pipelines = [p for p in ModelVersion.objects.filter(pipeline__isnull=False)
                 .select_related("model")
                 if any((s["model"], s["version"]) == (version.model.name, version.number)
                        for s in p.pipeline.get("steps", []))]
    for v in [version, *pipelines]:
        _withdraw(v, rejected=version, actor=actor, reason=reason)


def _withdraw(version: ModelVersion, *, rejected: ModelVersion, actor: Actor,
              reason: str) -> None:
    """`version` (the rejected one, or a pipeline running it) loses its traffic."""
    model = version.model
    alias = Alias.objects.filter(model=model, name=PRODUCTION_ALIAS, version=version).first()
    if alias is not None:
        alias.delete()
        record(actor, "alias.remove", target_type="alias",
               target=f"{model.name}@{PRODUCTION_ALIAS}", model_name=model.name,
               before={"alias": PRODUCTION_ALIAS, "version": version.number}, reason=reason)
    ep = Endpoint.objects.filter(model=model).first()
    if ep is None or not _holds_traffic(ep, version):
        return

    def change(ep: Endpoint, _model: RegisteredModel) -> dict:
        routing, ended = ep.routing, []
        pending = routing.rollout.pending_rollback
        if routing.live == version.pk or (pending and pending.version == version.number):
            role = (f"live in the {routing.live_color} slot" if routing.live_color
                    else "the stable" if routing.live == version.pk
                    else "the target of an unload-first rollback")
            what = f"version {version.number} of {model.name!r}"
            if version != rejected:
                what = (f"version {rejected.number} of {rejected.model.name!r} is a step of "
                        f"{what}, which")
            raise LifecycleError(
                f"{what} is {role}: roll back or deploy another version of {model.name!r} "
                f"before rejecting it", field="version",
                details={"version": version.number, "role": role})
        if ep.candidate_id == version.pk:  # as canary_abort: all traffic back to the stable
            ep.candidate, ep.candidate_weight = None, 0
            ep.rollout = ep.rollout.with_(analysis=None)
            ended.append("candidate")
        if routing.idle == version.pk:
            setattr(ep, routing.idle_color, None)
            ended.append(f"idle {routing.idle_color} slot")
        if ep.shadow_id == version.pk:
            ep.shadow = None
            ended.append("shadow")
        if version.pk in ep.warm_versions:  # kept loaded, it would still answer pinned requests
            ep.warm_versions = [pk for pk in ep.warm_versions if pk != version.pk]
            ended.append("warm")
        return {"version": version.number, "ended": ended}

    transition("withdraw", model_name=model.name, actor=actor, change=change, reason=reason,
               allow_archived=True)


def _holds_traffic(ep: Endpoint, version: ModelVersion) -> bool:
    routing = ep.routing
    pending = routing.rollout.pending_rollback
    return (version.pk in (routing.live, routing.candidate, routing.idle, routing.shadow)
            or version.pk in ep.warm_versions
            or bool(pending and pending.version == version.number))
