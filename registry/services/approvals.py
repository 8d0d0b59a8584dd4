"""The approval gate (as MLflow's and SageMaker's model registries): a model may require that a
version be approved before it is promoted. An engineer or admin other than the uploader approves
or rejects it, with a comment (required to reject); each decision is kept and audited.

`require_approved` is the one check every promotion calls: deploy, canary start and promote,
blue-green deploy and switch, and pointing the `production` alias. (This module imports no other
service: catalog.py calls it for the alias.)"""

from __future__ import annotations

from django.db import transaction

from registry.audit import Actor, record
from registry.choices import ApprovalState
from registry.errors import Forbidden, InvalidRequest, LifecycleError, NotFound
from registry.models import ApprovalDecision, ModelVersion, RegisteredModel
from registry.roles import has_role

PRODUCTION_ALIAS = "production"


class ApprovalRequired(LifecycleError):
    """A promotion of a version the model's approval rule does not allow yet (409)."""

    def __init__(self, model: RegisteredModel, version: ModelVersion):
        super().__init__(
            f"model {model.name!r} requires approval before promotion; version "
            f"{version.number} is {version.approval} — approve it first",
            field="version",
            details={"rule": "requires_approval", "version": version.number,
                     "approval": version.approval})


def approval_blocks(model: RegisteredModel, version: ModelVersion) -> bool:
    return model.requires_approval and version.approval != ApprovalState.APPROVED


def require_approved(model: RegisteredModel, version: ModelVersion) -> None:
    """Refuse (409) to promote `version` while its model requires approval it lacks."""
    if approval_blocks(model, version):
        raise ApprovalRequired(model, version)


def may_decide(user, version: ModelVersion) -> str | None:
    """Why `user` may not approve or reject `version`, or None when they may."""
    if not has_role(user, "engineer"):
        return "approving or rejecting a version needs the engineer or admin role"
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
        if not RegisteredModel.objects.filter(name=model_name).exists():
            raise NotFound(f"model {model_name!r} does not exist", field="model")
        try:  # the version row locked: two reviewers deciding at once take turns
            version = ModelVersion.objects.select_for_update().get(model__name=model_name,
                                                                   number=number)
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
    return version


def version_approve(*, model_name: str, number: int, actor: Actor,
                    comment: str = "") -> ModelVersion:
    return _decide(ApprovalState.APPROVED, model_name=model_name, number=number, actor=actor,
                   comment=comment)


def version_reject(*, model_name: str, number: int, actor: Actor,
                   comment: str) -> ModelVersion:
    return _decide(ApprovalState.REJECTED, model_name=model_name, number=number, actor=actor,
                   comment=comment)
