"""Plan and apply an mmc.yaml through the registry's own services.

An apply is all or nothing: every change of the file runs in one transaction (the services'
own atomic blocks nest in it as savepoints), so a refusal anywhere — an unapproved version, an
incompatible signature, a state that forbids a step — leaves the registry as it was, with the
refusing service's message, and is audited as `config.apply.refused` (as is a file refused for
its shape). The models the file names are row-locked first, in name order, so two applies (or an
apply and a console action) take turns instead of deadlocking. A plan runs the very same calls
and rolls them back: it is refused where the apply would be. An apply that changed something
writes one `config.apply` audit event with the file's sha256, its `source` (a git commit) and
the changes; one that finds nothing to change writes nothing and says so."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from django.db import transaction

from registry.audit import Actor, record
from registry.errors import Forbidden, LifecycleError, RegistryError
from registry.models import RegisteredModel
from registry.roles import has_role, require_model
from registry.services.as_code.document import read, text_sha256
from registry.services.as_code.plan import Change, model_changes, resolve, webhook_changes
from registry.services.as_code.state import models_state, webhooks_state

APPLY = "config.apply"
REFUSED = "config.apply.refused"


@dataclass(frozen=True)
class Outcome:
    """What a plan found, or what an apply did."""

    changes: list[Change]
    sha256: str
    prune: bool = False
    not_pruned: list[str] = field(default_factory=list)
    applied: bool = False
    source: str = ""
    audit_event: int | None = None

    @property
    def summary(self) -> dict[str, int]:
        return {action: sum(c.action == action for c in self.changes)
                for action in ("create", "update", "delete")}

    @property
    def detail(self) -> str:
        if not self.changes:
            return "no changes: the registry already matches the file"
        counts = self.summary
        if self.applied:
            return (f"applied: {counts['create']} created, {counts['update']} updated, "
                    f"{counts['delete']} deleted")
        return (f"{counts['create']} to create, {counts['update']} to update, "
                f"{counts['delete']} to delete")

    def as_dict(self) -> dict[str, Any]:
        return {"changes": [c.as_dict() for c in self.changes], "summary": self.summary,
                "detail": self.detail, "sha256": self.sha256, "prune": self.prune,
                "not_pruned": self.not_pruned, "applied": self.applied, "source": self.source,
                "audit_event": self.audit_event}


def _changes(document: dict, *, actor: Actor, prune: bool,
             secrets: dict[str, str]) -> tuple[list[Change], list[str]]:
    names = sorted(document.get("models") or {})
    # Lock first, in one order: the services lock each model again (a no-op), and the route
    # revision row only after every model the apply touches is held.
    list(RegisteredModel.objects.select_for_update().filter(name__in=names).order_by("name")
         .values_list("pk", flat=True))
    for name in names if actor.user is not None else ():  # the system acts everywhere
        require_model(actor.user, name, "engineer")  # another team's model: "does not exist"
    states = models_state(names)
    wanted = resolve(document, states)
    changes: list[Change] = []
    kept: list[str] = []
    for name in names:
        more, also_kept = model_changes(name, states[name], wanted[name], prune)
        changes += more
        kept += also_kept
    if "webhooks" in document:
        if not has_role(actor.user, "admin"):
            raise Forbidden("the file's webhooks section needs the admin role, as the webhook "
                            "API does")
        more, also_kept = webhook_changes(document["webhooks"], webhooks_state(), prune=prune,
                                          secrets=secrets)
        changes += more
        kept += also_kept
    return changes, kept


def _run(changes: list[Change], *, actor: Actor, reason: str) -> None:
    """Every call of every change, phase by phase; within a phase in the file's order (an
    endpoint's steps stay in theirs)."""
    calls = sorted((call for change in changes for call in change.calls), key=lambda c: c.phase)
    for call in calls:
        kwargs = {**call.kwargs, "actor": actor}
        if call.reason:
            kwargs["reason"] = reason
        call.service(**kwargs)


def _converged(document: dict, *, actor: Actor, prune: bool, secrets: dict[str, str]) -> None:
    """Read the registry again: what was run must leave nothing to change (else the next apply
    would change something again), or none of it is kept."""
    left, _ = _changes(document, actor=actor, prune=prune, secrets=secrets)
    if left:
        raise LifecycleError("the apply would leave differences it cannot make: "
                             + ", ".join(c.resource for c in left),
                             details={"changes": [c.as_dict() for c in left]})


def _target(source: str, sha256: str) -> str:
    return source[:200] if source else f"sha256:{sha256[:12]}"


def _reason(source: str, sha256: str) -> str:
    return f"mmc apply of {source}" if source else f"mmc apply of mmc.yaml (sha256 {sha256[:12]})"


def config_plan(*, text: str, actor: Actor, prune: bool = False,
                secrets: dict[str, str] | None = None) -> Outcome:
    """What `config_apply` would change, tried: the same service calls run in a transaction
    that is always rolled back, so a plan is refused exactly where the apply would be."""
    document = read(text)
    secrets = secrets or {}
    with transaction.atomic():
        changes, kept = _changes(document, actor=actor, prune=prune, secrets=secrets)
        if changes:
            _run(changes, actor=actor, reason="mmc plan (rolled back)")
            _converged(document, actor=actor, prune=prune, secrets=secrets)
        transaction.set_rollback(True)
    return Outcome(changes=changes, sha256=text_sha256(text), prune=prune, not_pruned=kept)


def config_apply(*, text: str, actor: Actor, source: str = "", prune: bool = False,
                 secrets: dict[str, str] | None = None) -> Outcome:
    """Make the registry what the file says, all or nothing (see the module's docstring)."""
    sha256 = text_sha256(text)
    secrets = secrets or {}
    document: dict = {}
    try:
        document = read(text)
        with transaction.atomic():
            changes, kept = _changes(document, actor=actor, prune=prune, secrets=secrets)
            if not changes:
                return Outcome(changes=[], sha256=sha256, prune=prune, not_pruned=kept,
                               source=source)
            _run(changes, actor=actor, reason=_reason(source, sha256))
            _converged(document, actor=actor, prune=prune, secrets=secrets)
            outcome = Outcome(changes=changes, sha256=sha256, prune=prune, not_pruned=kept,
                              applied=True, source=source)
            event = record(actor, APPLY, target_type="config", target=_target(source, sha256),
                           reason=_reason(source, sha256),
                           after={"sha256": sha256, "source": source, "prune": prune,
                                  "summary": outcome.summary,
                                  "changes": [c.as_dict() for c in changes]})
    except RegistryError as exc:
        with transaction.atomic():
            record(actor, REFUSED, target_type="config", target=_target(source, sha256),
                   reason=_reason(source, sha256),
                   after={"sha256": sha256, "source": source, "prune": prune,
                          "error": exc.message, "field": exc.field,
                          "models": sorted(document.get("models") or {})})
        raise
    return replace(outcome, audit_event=event.pk)
