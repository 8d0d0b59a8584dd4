"""The registry as mmc.yaml sees it: each model's attributes, aliases, versions (number, sha256,
serving settings), endpoint routing and settings, and the webhooks, read in a few queries; and
the export, today's state written as such a file, so that exporting then planning shows no
change."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from registry.models import Alias, Endpoint, ModelVersion, RegisteredModel, WebhookSubscription
from registry.monitoring.capture import capture_settings_of
from registry.roles import visible_models
from registry.routing import ANALYSING, BLUE_GREEN, CANARY, UNLOADING
from registry.services.as_code.transitions import Route
from registry.services.limits import limits_of
from registry.services.versions import SERVING_FIELDS

#: A version's serving settings as a new version has them (the export leaves these out).
DEFAULT_SETTINGS = {name: ModelVersion._meta.get_field(name).get_default()
                    for name in SERVING_FIELDS}


@dataclass
class ModelState:
    """One model as the registry holds it now (`exists` False: the file would create it)."""

    name: str
    exists: bool = False
    attributes: dict[str, Any] = field(default_factory=dict)
    archived: bool = False
    numbers: set[int] = field(default_factory=set)
    by_sha256: dict[str, int] = field(default_factory=dict)
    settings: dict[int, dict[str, Any]] = field(default_factory=dict)
    pipelines: set[int] = field(default_factory=set)
    aliases: dict[str, int] = field(default_factory=dict)
    has_endpoint: bool = False
    route: Route = field(default_factory=Route)
    endpoint_settings: dict[str, Any] = field(default_factory=dict)


def version_settings(version: ModelVersion) -> dict[str, Any]:
    return {name: getattr(version, name) for name in SERVING_FIELDS}


def route_of(endpoint: Endpoint, numbers: dict[int, int]) -> Route:
    """An endpoint's routing by version number (`numbers`: version id -> number)."""
    routing = endpoint.routing.map(numbers.get)
    state = routing.state
    analysis = routing.rollout.analysis
    pending = routing.rollout.pending_rollback
    blue_green = routing.rollout.blue_green
    return Route(
        state=state,
        stable=pending.version if state == UNLOADING else routing.stable,
        candidate=routing.candidate, weight=routing.candidate_weight,
        analysis=analysis.plan.as_dict() if analysis and state == ANALYSING else None,
        paused=analysis.plan.as_dict() if analysis and state == CANARY else None,
        live=routing.live if state == BLUE_GREEN else None,
        idle=routing.idle if state == BLUE_GREEN else None,
        switched=bool(blue_green and blue_green.switched_at),
        shadow=routing.shadow)


def endpoint_settings(endpoint: Endpoint) -> dict[str, Any]:
    return {"scale_to_zero_after_seconds": endpoint.scale_to_zero_after_seconds,
            "rate_limits": limits_of(endpoint), "capture": capture_settings_of(endpoint)}


def models_state(names: list[str] | None = None, *, include_archived: bool = True,
                 user=None) -> dict[str, ModelState]:
    """The named models (every model when None; with `user`, every model that user may see),
    each with what the file can say of it."""
    models = RegisteredModel.objects.select_related("team").order_by("name")
    if user is not None:
        models = visible_models(models, user)
    if names is not None:
        models = models.filter(name__in=names)
    if not include_archived:
        models = models.filter(archived=False)
    found = {m.pk: m for m in models}
    out = {name: ModelState(name=name) for name in names or ()}
    for m in found.values():
        out[m.name] = ModelState(
            name=m.name, exists=True, archived=m.archived,
            attributes={"description": m.description, "tags": sorted(m.tags or []),
                        "requires_approval": m.requires_approval, "team": m.team.name})
    numbers: dict[int, int] = {}
    for v in ModelVersion.objects.filter(model_id__in=found).only(
            "model_id", "number", "sha256", "pipeline", *SERVING_FIELDS):
        state = out[found[v.model_id].name]
        numbers[v.pk] = v.number
        state.numbers.add(v.number)
        state.by_sha256[v.sha256] = v.number
        state.settings[v.number] = version_settings(v)
        if v.pipeline is not None:
            state.pipelines.add(v.number)
    for model_id, alias, version_id in Alias.objects.filter(model_id__in=found).values_list(
            "model_id", "name", "version_id"):
        out[found[model_id].name].aliases[alias] = numbers[version_id]
    for endpoint in Endpoint.objects.filter(model_id__in=found):
        state = out[found[endpoint.model_id].name]
        state.has_endpoint = True
        state.route = route_of(endpoint, numbers)
        state.endpoint_settings = endpoint_settings(endpoint)
    return out


def webhooks_state() -> list[WebhookSubscription]:
    """Every webhook subscription, oldest first (the first one of a url is the file's)."""
    return list(WebhookSubscription.objects.select_related("model").order_by("id"))


def webhook_entry(sub: WebhookSubscription) -> dict[str, Any]:
    return {"url": sub.url, "model": sub.model.name if sub.model else None, "name": sub.name,
            "events": sorted(sub.events or []), "active": sub.active}


# -- export -------------------------------------------------------------------------------------


def export_document(*, include_webhooks: bool, user=None) -> dict[str, Any]:
    """Today's state as an mmc.yaml document: every model that is not archived (that `user`
    may see, when given), with its
    aliases, the serving settings that differ from a new version's (for the versions its
    endpoint routes or an alias names), and its endpoint if it has one; the webhooks (without
    their secrets) when `include_webhooks`."""
    models = {}
    for name, state in models_state(include_archived=False, user=user).items():
        entry: dict[str, Any] = dict(state.attributes)
        if state.aliases:
            entry["aliases"] = dict(sorted(state.aliases.items()))
        named = set(state.aliases.values())
        if state.has_endpoint:
            route = state.route
            named |= {n for n in (route.stable, route.candidate, route.live, route.idle,
                                  route.shadow) if n is not None}
        versions = {}
        for number in sorted(named):
            changed = {k: v for k, v in state.settings.get(number, {}).items()
                       if v != DEFAULT_SETTINGS[k]}
            if changed and number not in state.pipelines:
                versions[number] = changed
        if versions:
            entry["versions"] = versions
        if state.has_endpoint:
            entry["endpoint"] = {**state.route.as_file(), **state.endpoint_settings}
        models[name] = entry
    document: dict[str, Any] = {"format": 1, "models": models}
    if include_webhooks:
        seen: set[str] = set()
        hooks = []
        for sub in webhooks_state():
            if sub.url not in seen:
                seen.add(sub.url)
                hooks.append(webhook_entry(sub))
        document["webhooks"] = hooks
    return document


HEADER = """\
# yaml-language-server: $schema={schema_url}
# mmc.yaml: what the model management console should serve (docs/guide/as-code.md).
# `mmc plan -f mmc.yaml` shows what `mmc apply -f mmc.yaml` would change.
"""


def export_text(*, include_webhooks: bool, schema_url: str, user=None) -> str:
    body = yaml.safe_dump(export_document(include_webhooks=include_webhooks, user=user),
                          sort_keys=False,
                          default_flow_style=False, allow_unicode=True)
    return HEADER.format(schema_url=schema_url) + body
