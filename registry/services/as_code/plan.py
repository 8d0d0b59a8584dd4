"""What an mmc.yaml would change: its version references resolved against the registry (a
number, an alias as the file leaves it, a sha256), then compared resource by resource with what
the registry holds. Each `Change` carries the service calls that make it so, with the phase that
orders them across the file: models, webhooks, serving settings, aliases, then routing.

A section the file leaves out is not compared. `prune` removes, within the sections the file
has, the aliases and webhooks it does not name; it never removes a model, a version or an
endpoint's routing (the file says `stable: null` to stop serving)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from registry.errors import InvalidRequest
from registry.models import Endpoint, WebhookSubscription
from registry.monitoring.capture import capture_settings_of
from registry.routing import AnalysisPlan
from registry.services import (
    capture,
    catalog,
    deployments,
    limits,
    rollouts,
    scaling,
    teams,
    versions,
)
from registry.services import webhooks as hooks
from registry.services.as_code.document import refused
from registry.services.as_code.state import ModelState, webhook_entry
from registry.services.as_code.transitions import Route, route_steps

# Phases, in the order an apply runs them.
MODELS, WEBHOOKS, SETTINGS, ALIASES, ROUTING = range(5)
ATTRIBUTES = ("description", "tags", "requires_approval", "team")
NEW_ENDPOINT = {"scale_to_zero_after_seconds": 0,
                "rate_limits": {"rps": 0.0, "burst": 0, "daily_quota": 0},
                "capture": capture_settings_of(Endpoint())}  # a new endpoint's defaults
NEW_WEBHOOK = {"model": None, "name": "", "events": [], "active": True}
#: The state machine's operations a routing step names (transitions.Step.service).
ROUTING_SERVICES: dict[str, Callable[..., Any]] = {
    "endpoint_deploy": deployments.endpoint_deploy,
    **{name: getattr(rollouts, name) for name in (
        "canary_start", "canary_weight", "canary_promote", "canary_abort", "analysis_pause",
        "analysis_resume", "bluegreen_deploy", "bluegreen_switch", "bluegreen_switch_back",
        "bluegreen_finish", "shadow_start", "shadow_stop")},
}


@dataclass(frozen=True)
class Call:
    """One service call of an apply: `reason` says whether the service takes one."""

    phase: int
    service: Callable[..., Any]
    kwargs: dict[str, Any]
    text: str
    reason: bool = False


@dataclass(frozen=True)
class Change:
    resource: str  # "endpoint fraud", "alias fraud@production", "webhook https://…"
    action: str  # create, update, delete
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    calls: tuple[Call, ...] = field(default=(), repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {"resource": self.resource, "action": self.action, "before": self.before,
                "after": self.after, "steps": [c.text for c in self.calls]}


# -- resolving the file's references ----------------------------------------------------------


class _Resolver:
    """A model's version references as numbers; what does not resolve is collected, with the
    path of the key that named it."""

    def __init__(self, state: ModelState, errors: list[tuple[str, str]]):
        self.state, self.errors = state, errors
        self.aliases = dict(state.aliases)

    def number(self, ref: int | str, path: str) -> int | None:
        name, state = self.state.name, self.state
        if isinstance(ref, int) or ref.isdigit():
            number = int(ref)
        elif ref.startswith("sha256:"):
            number = state.by_sha256.get(ref.removeprefix("sha256:"))
            if number is None:
                self.errors.append((path, f"model {name!r} has no version with {ref[:19]}…"))
                return None
        else:
            number = self.aliases.get(ref)
            if number is None:
                self.errors.append((path, f"model {name!r} has no alias {ref!r}"))
                return None
        if number not in state.numbers:
            why = "" if state.exists else " (the file creates it: a new model has no versions)"
            self.errors.append((path, f"model {name!r} has no version {number}{why}"))
            return None
        return number


def resolve(document: dict, states: dict[str, ModelState]) -> dict[str, dict[str, Any]]:
    """Each model's section with its references as version numbers and its values as the
    registry keeps them (tags sorted, rps a float, an analysis plan with its defaults); a 400
    naming every reference that does not resolve."""
    errors: list[tuple[str, str]] = []
    out = {}
    for name, section in (document.get("models") or {}).items():
        path = f"models.{name}"
        refs = _Resolver(states[name], errors)
        wanted: dict[str, Any] = {k: section[k] for k in ATTRIBUTES if k in section}
        if "tags" in wanted:
            wanted["tags"] = sorted(set(wanted["tags"]))
        if "aliases" in section:
            wanted["aliases"] = {alias: refs.number(ref, f"{path}.aliases.{alias}")
                                 for alias, ref in section["aliases"].items()}
            refs.aliases.update(wanted["aliases"])  # an alias means what the file makes it
        if "versions" in section:
            wanted["versions"] = {}
            named: dict[int, str] = {}
            for ref, settings in section["versions"].items():
                number = refs.number(ref, f"{path}.versions.{ref}")
                if number in named:
                    errors.append((f"{path}.versions.{ref}",
                                   f"is version {number}, as versions.{named[number]} is"))
                elif number is not None:
                    named[number] = ref
                    if "preferred_batch_sizes" in settings:
                        settings = {**settings, "preferred_batch_sizes": sorted(
                            set(settings["preferred_batch_sizes"]))}
                    wanted["versions"][number] = settings
        if "endpoint" in section:
            wanted["endpoint"] = _endpoint(section["endpoint"], refs, f"{path}.endpoint", errors)
        out[name] = wanted
    if errors:
        raise refused(errors)
    return out


def _endpoint(section: dict, refs: _Resolver, path: str, errors: list) -> dict[str, Any]:
    endpoint = dict(section)
    for key in ("stable", "candidate", "shadow"):
        if endpoint.get(key) is not None:
            endpoint[key] = refs.number(endpoint[key], f"{path}.{key}")
    if "blue_green" in endpoint:
        endpoint["blue_green"] = {slot: refs.number(ref, f"{path}.blue_green.{slot}")
                                  for slot, ref in endpoint["blue_green"].items()}
    if "analysis" in endpoint:
        try:
            endpoint["analysis"] = AnalysisPlan.clean(endpoint["analysis"]).as_dict()
        except InvalidRequest as exc:
            errors.append((f"{path}.analysis", exc.message))
    if "rate_limits" in endpoint:
        endpoint["rate_limits"] = {k: float(v) if k == "rps" else v
                                   for k, v in endpoint["rate_limits"].items()}
    return endpoint


# -- differences --------------------------------------------------------------------------------


def _differing(current: dict, wanted: dict) -> tuple[dict, dict]:
    keys = [k for k in wanted if current.get(k) != wanted[k]]
    return {k: current.get(k) for k in keys}, {k: wanted[k] for k in keys}


def model_changes(name: str, state: ModelState, wanted: dict[str, Any],
                  prune: bool) -> tuple[list[Change], list[str]]:
    """The changes of one model (attributes, serving settings, aliases, endpoint), and the
    aliases an apply with prune would remove."""
    changes, kept = [], []
    attributes = {k: wanted[k] for k in ATTRIBUTES if k in wanted}
    if not state.exists:
        calls = [Call(MODELS, catalog.model_create, {
            "name": name, "description": attributes.get("description", ""),
            "tags": attributes.get("tags", []), "team": attributes.get("team")},
            "create the model")]
        if attributes.get("requires_approval"):
            calls.append(Call(MODELS, catalog.model_update, {
                "name": name, "requires_approval": True}, "require approval"))
        changes.append(Change(f"model {name}", "create", None, attributes, tuple(calls)))
    else:
        before, after = _differing(state.attributes, attributes)
        if "team" in after:
            changes.append(Change(f"model {name}", "update", {"team": before.pop("team")},
                                  {"team": after["team"]}, (Call(
                                      MODELS, teams.model_move,
                                      {"name": name, "team": after.pop("team")},
                                      f"move to the team {attributes['team']}"),)))
        if after:
            changes.append(Change(f"model {name}", "update", before, after, (Call(
                MODELS, catalog.model_update, {"name": name, **after},
                "set " + ", ".join(after)),)))
    for number, settings in sorted(wanted.get("versions", {}).items()):
        before, after = _differing(state.settings.get(number, {}), settings)
        if after:
            changes.append(Change(f"version {name}:{number}", "update", before, after, (Call(
                SETTINGS, versions.version_configure,
                {"model_name": name, "number": number, **after},
                "set " + ", ".join(f"{k} to {v}" for k, v in after.items())),)))
    if "aliases" in wanted:
        for alias, number in sorted(wanted["aliases"].items()):
            current = state.aliases.get(alias)
            if current != number:
                changes.append(Change(
                    f"alias {name}@{alias}", "create" if current is None else "update",
                    None if current is None else {"version": current}, {"version": number},
                    (Call(ALIASES, catalog.alias_set, {
                        "model_name": name, "alias": alias, "version_number": number},
                        f"point {alias} at version {number}"),)))
        for alias in sorted(set(state.aliases) - set(wanted["aliases"])):
            resource = f"alias {name}@{alias}"
            if not prune:
                kept.append(resource)
                continue
            changes.append(Change(resource, "delete", {"version": state.aliases[alias]}, None, (
                Call(ALIASES, catalog.alias_remove, {"model_name": name, "alias": alias},
                     f"remove the alias {alias}"),)))
    if "endpoint" in wanted:
        change = endpoint_change(name, state, wanted["endpoint"])
        if change:
            changes.append(change)
    return changes, kept


def endpoint_change(name: str, state: ModelState, wanted: dict[str, Any]) -> Change | None:
    current = state.endpoint_settings or NEW_ENDPOINT
    before: dict[str, Any] = {}
    after: dict[str, Any] = {}
    calls = []
    seconds = wanted.get("scale_to_zero_after_seconds")
    if seconds is not None and seconds != current["scale_to_zero_after_seconds"]:
        before["scale_to_zero_after_seconds"] = current["scale_to_zero_after_seconds"]
        after["scale_to_zero_after_seconds"] = seconds
        calls.append(Call(SETTINGS, scaling.scale_to_zero_set, {
            "model_name": name, "seconds": seconds},
            f"scale to zero after {seconds} idle seconds" if seconds else "never scale to zero",
            reason=True))
    limits_before, limits_after = _differing(current["rate_limits"],
                                             wanted.get("rate_limits", {}))
    if limits_after:
        before["rate_limits"], after["rate_limits"] = limits_before, limits_after
        calls.append(Call(SETTINGS, limits.limits_set, {"model_name": name, **limits_after},
                          "set " + ", ".join(f"{k} to {v:g}" for k, v in limits_after.items()),
                          reason=True))
    capture_before, capture_after = _differing(current["capture"], wanted.get("capture", {}))
    if capture_after:
        before["capture"], after["capture"] = capture_before, capture_after
        calls.append(Call(SETTINGS, capture.capture_set,
                          {"model_name": name, "values": capture_after},
                          "capture " + ", ".join(f"{k} {v}" for k, v in capture_after.items()),
                          reason=True))
    route = Route.from_file(wanted)
    steps = route_steps(state.route, route) if route is not None else []
    if steps:  # the routing first: it is what a reader looks for
        before = {**state.route.as_file(), **before}
        after = {**route.as_file(), **after}
        calls += [Call(ROUTING, ROUTING_SERVICES[s.service], {"model_name": name, **s.args},
                       s.text, reason=True) for s in steps]
    if not calls:
        return None
    return Change(f"endpoint {name}", "update" if state.has_endpoint else "create", before,
                  after, tuple(calls))


def webhook_changes(wanted: list[dict], current: list[WebhookSubscription], *, prune: bool,
                    secrets: dict[str, str]) -> tuple[list[Change], list[str]]:
    """Webhooks by url: created, changed (only the keys the file gives; the secret when the
    variable `secret_env` names was sent and differs), and, with prune, deleted when the file
    no longer names their url (a url's later duplicates too)."""
    errors = []
    for i, hook in enumerate(wanted):
        value = secrets.get(hook.get("secret_env", ""))
        if value is not None and not 16 <= len(value) <= 200:
            errors.append((f"webhooks[{i}].secret_env",
                           f"the value sent for {hook['secret_env']} must be 16-200 characters"))
    if errors:
        raise refused(errors)
    first: dict[str, WebhookSubscription] = {}
    extra = []
    for sub in current:
        if sub.url in first:
            extra.append(sub)
        else:
            first[sub.url] = sub
    changes, kept = [], []
    for hook in wanted:
        url, env = hook["url"], hook.get("secret_env")
        given = {k: (sorted(set(v)) if k == "events" else v) for k, v in hook.items()
                 if k in NEW_WEBHOOK}
        secret = secrets.get(env) if env else None
        sub = first.get(url)
        if sub is None:
            entry = {**NEW_WEBHOOK, **given}
            text = "subscribe" + (f" (secret from {env})" if secret else
                                  " (a generated secret)")
            changes.append(Change(f"webhook {url}", "create", None, {"url": url, **entry}, (
                Call(WEBHOOKS, hooks.webhook_create, {"url": url, "secret": secret, **entry},
                     text),)))
            continue
        before, after = _differing(webhook_entry(sub), given)
        changed = dict(after)
        if secret is not None and secret != sub.secret:
            before["secret"], after["secret"] = "(kept)", f"(from {env})"
            changed["secret"] = secret
        if changed:
            changes.append(Change(f"webhook {url}", "update", before, after, (Call(
                WEBHOOKS, hooks.webhook_update, {"webhook_id": sub.pk, **changed},
                "set " + ", ".join(after)),)))
    named = {hook["url"] for hook in wanted}
    for sub in [s for s in first.values() if s.url not in named] + extra:
        if not prune:
            kept.append(f"webhook {sub.url}")
            continue
        changes.append(Change(f"webhook {sub.url}", "delete", webhook_entry(sub), None, (Call(
            WEBHOOKS, hooks.webhook_delete, {"webhook_id": sub.pk}, "delete the subscription"),)))
    return changes, kept
