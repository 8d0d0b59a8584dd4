from __future__ import annotations

import re

from django.db import IntegrityError, transaction
from django.db.models import Max

from registry.audit import Actor, record
from registry.errors import Forbidden, InvalidRequest, LifecycleError, NotFound
from registry.models import (
    DEFAULT_TEAM,
    SLUG,
    Alias,
    AuditEvent,
    ModelVersion,
    RegisteredModel,
    Team,
    VersionStatus,
)
from registry.roles import is_admin, may, teams_where
from registry.services.gate import PRODUCTION_ALIAS, admit


def lock_model(name: str, *, allow_archived: bool = False) -> RegisteredModel:
    """The model row, locked for the rest of the transaction."""
    try:
        model = RegisteredModel.objects.select_for_update().get(name=name)
    except RegisteredModel.DoesNotExist:
        raise NotFound(f"model {name!r} does not exist",
                       field="model") from None
    if model.archived and not allow_archived:
        raise LifecycleError(f"model {name!r} is archived; unarchive it first")
    return model


def next_version_number(model: RegisteredModel) -> int:
    """The number the model's next version gets: one past the highest it ever had, deleted ones
    too (the audit log keeps their numbers), so a number never names two artifacts."""
    highest = model.versions.aggregate(n=Max("number"))["n"] or 0
    for before in AuditEvent.objects.filter(
            model_name=model.name, action__in=("version.delete", "model.delete")
    ).values_list("before", flat=True):
        removed = (before or {}).get("versions") or [before or {}]
        highest = max([highest, *(v.get("number") or 0 for v in removed)])
    return highest + 1


def _snapshot(model: RegisteredModel) -> dict:
    return {"name": model.name, "description": model.description, "tags": model.tags,
            "archived": model.archived, "requires_approval": model.requires_approval,
            "owner": model.owner.get_username() if model.owner else None,
            "team": model.team.name}


TAG = re.compile(r"^[A-Za-z0-9_.:/=+-]{1,50}$")


def _clean_tags(tags) -> list[str]:
    if not isinstance(tags, list) or not all(isinstance(t, str) and TAG.match(t) for t in tags):
        raise InvalidRequest("tags must be a list of 1-50 character strings of letters, digits "
                             "and _ . : / = + -", field="tags")
    return sorted(set(tags))


def team_for_new_model(user, team: str | None) -> Team:
    """The team a model `user` registers goes to: the one named, or else the team "default"
    where the user may create models there, or else the user's only team where they may."""
    if team:
        row = Team.objects.filter(name=team).first()
        teams = teams_where(user)
        if row is None or (teams is not None and row.pk not in teams):
            raise InvalidRequest(f"team {team!r} does not exist", field="team")
        if not may(user, row.pk, "engineer"):
            raise Forbidden(f"registering a model in {team!r} needs the engineer role there")
        return row
    if user is None or is_admin(user):
        return Team.objects.get_or_create(name=DEFAULT_TEAM)[0]
    able = teams_where(user, "engineer") or set()
    rows = list(Team.objects.filter(pk__in=able))
    for row in rows:
        if row.name == DEFAULT_TEAM:
            return row
    if len(rows) == 1:
        return rows[0]
    if not rows:
        raise Forbidden("registering a model needs the engineer role in a team")
    raise InvalidRequest("name the team the model goes to: you are an engineer in "
                         + ", ".join(sorted(r.name for r in rows)), field="team")


def model_create(*, name: str, actor: Actor, description: str = "", tags=None,
                 team: str | None = None) -> RegisteredModel:
    """Register a model in `team` (team_for_new_model says which when none is named)."""
    try:
        SLUG(name)
    except Exception as exc:
        raise InvalidRequest(f"name {name!r}: {' '.join(exc.messages)}", field="name") from None
    owner_team = team_for_new_model(actor.user, team)
    with transaction.atomic():
        try:
            with transaction.atomic():
                model = RegisteredModel.objects.create(
                    name=name, description=description, tags=_clean_tags(tags or []),
                    owner=actor.user, team=owner_team,
                )
        except IntegrityError:
            raise LifecycleError(f"a model named {name!r} already exists", field="name") from None
        record(actor, "model.create", target_type="model", target=name, model_name=name,
               after=_snapshot(model))
    return model


def model_update(*, name: str, actor: Actor, description: str | None = None,
                 tags=None, requires_approval: bool | None = None) -> RegisteredModel:
    with transaction.atomic():
        model = lock_model(name, allow_archived=True)
        before = _snapshot(model)
        if description is not None:
            model.description = description
        if tags is not None:
            model.tags = _clean_tags(tags)
        if requires_approval is not None:
            if not isinstance(requires_approval, bool):
                raise InvalidRequest("requires_approval must be true or false",
                                     field="requires_approval")
            model.requires_approval = requires_approval
        model.save()
        record(actor, "model.update", target_type="model", target=name, model_name=name,
               before=before, after=_snapshot(model))
    return model


def model_archive(*, name: str, actor: Actor, archived: bool = True,
                  reason: str = "") -> RegisteredModel:
    """Archiving hides a model and refuses new uploads; it never deletes versions."""
    with transaction.atomic():
        model = lock_model(name, allow_archived=True)
        if model.archived == archived:
            state = "archived" if archived else "active"
            raise LifecycleError(f"model {name!r} is already {state}")
        endpoint = getattr(model, "endpoint", None)
        if archived and endpoint and (endpoint.stable_id or endpoint.live_color):
            raise LifecycleError(f"model {name!r} is being served; undeploy it before archiving")
        before = _snapshot(model)
        model.archived = archived
        model.save(update_fields=["archived", "updated_at"])
        record(actor, "model.archive" if archived else "model.unarchive", target_type="model",
               target=name, model_name=name, before=before, after=_snapshot(model), reason=reason)
    return model


def alias_set(*, model_name: str, alias: str, version_number: int, actor: Actor) -> Alias:
    try:
        SLUG(alias)
    except Exception as exc:
        raise InvalidRequest(f"alias {alias!r}: {' '.join(exc.messages)}", field="alias") from None
    with transaction.atomic():
        model = lock_model(model_name)
        try:
            version = model.versions.get(number=version_number)
        except ModelVersion.DoesNotExist:
            raise NotFound(f"model {model_name!r} has no version {version_number}",
                           field="version") from None
        if alias == PRODUCTION_ALIAS:  # the version production traffic is told to use
            version.model = model
            admit(version, role=f"hold the {PRODUCTION_ALIAS} alias")
        elif version.status != VersionStatus.READY:
            why = f": {version.failure_reason}" if version.failure_reason else ""
            raise LifecycleError(f"version {version_number} is {version.status}{why}; an alias "
                                 f"can only point at a ready version", field="version")
        existing = Alias.objects.filter(model=model, name=alias).first()
        before = {"alias": alias, "version": existing.version.number} if existing else None
        if existing:
            existing.version = version
            existing.save()
            obj = existing
        else:
            obj = Alias.objects.create(model=model, name=alias, version=version)
        record(actor, "alias.set", target_type="alias", target=f"{model_name}@{alias}",
               model_name=model_name, before=before,
               after={"alias": alias, "version": version.number})
    return obj


def alias_remove(*, model_name: str, alias: str, actor: Actor) -> None:
    with transaction.atomic():
        model = lock_model(model_name, allow_archived=True)
        obj = Alias.objects.filter(model=model, name=alias).select_related("version").first()
        if obj is None:
            raise NotFound(f"model {model_name!r} has no alias {alias!r}", field="alias")
        before = {"alias": alias, "version": obj.version.number}
        obj.delete()
        record(actor, "alias.remove", target_type="alias", target=f"{model_name}@{alias}",
               model_name=model_name, before=before)
