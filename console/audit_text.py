"""The audit log in words: one sentence per event and the fields it changed, for the console's
audit page (the CSV export keeps the raw before/after JSON)."""

from __future__ import annotations

import json
from dataclasses import dataclass

#: endpoint.<op> -> the verb the sentence uses (the op is the service's transition name).
ENDPOINT_VERBS = {
    "deploy": "deployed", "promote": "promoted", "canary": "started a canary of",
    "weight": "moved the canary weight of", "abort": "aborted the canary on",
    "pause": "paused the canary analysis on", "resume": "resumed the canary analysis on",
    "advance": "advanced the canary analysis on", "analysis.advance": "advanced the canary of",
    "rollback": "rolled back", "rollback-load": "finished the rollback of",
    "bg-deploy": "put a version on the idle colour of", "switch": "switched blue/green traffic of",
    "switch-back": "switched blue/green traffic back on", "bg-finish": "finished blue/green on",
    "shadow-start": "started shadowing on", "shadow-stop": "stopped shadowing on",
    "undeploy": "undeployed", "withdraw": "withdrew a rejected version's traffic on",
    "protect": "made a predict key required on every call to",
    "open": "removed the predict key requirement from",
    "analysis.stale": "dropped the candidate's weight to 0 (canary analysis stale) on",
}
SIMPLE = {
    "model.create": "created model {target}", "model.update": "edited model {target}",
    "model.archive": "archived model {target}", "model.delete": "deleted model {target}",
    "version.delete": "deleted version {target}", "model.unarchive": "unarchived model {target}",
    "token.create": "created API token {target}", "token.revoke": "revoked API token {target}",
    "token.login": "logged in to the CLI (token {target})",
    "user.create": "created user {target}", "user.role": "changed the role of {target}",
    "user.activate": "reactivated user {target}", "user.deactivate": "deactivated user {target}",
    "user.password_reset": "reset the password of {target}",
    "user.sso_login": "signed in with single sign-on as {target}",
    "apikey.create": "created a predict key for {model}",
    "apikey.revoke": "revoked a predict key of {model}",
    "limits.set": "changed the rate limits of {model}",
    "endpoint.scale_to_zero": "changed when {model} scales to zero",
    "webhook.create": "created webhook {target}", "webhook.update": "changed webhook {target}",
    "webhook.delete": "deleted webhook {target}", "webhook.test": "sent a test to webhook {target}",
    "dataset.upload": "uploaded dataset {target}", "job.cancel": "cancelled job {short}",
    "replica.remove": "removed replica {target}", "replica.forget": "forgot replica {target}",
    "jobs.expire": "expired old job results", "datasets.expire": "expired old datasets",
    "artifacts.gc": "removed unreferenced artifacts",
    "config.apply": "applied mmc.yaml ({target})",
}


@dataclass(frozen=True)
class Change:
    field: str
    before: str
    after: str


def _v(number) -> str:
    return f"v{number}" if number not in (None, "") else "none"


def _show(value) -> str:
    if value is None or value == "":
        return "—"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def _brief(text: str, limit: int = 120) -> str:
    """A sentence keeps a long reason short; the full text is in the changed fields."""
    return text if len(text) <= limit else text[:limit].rstrip() + " (see the change)"


def changes(before: dict | None, after: dict | None) -> list[Change]:
    """The fields whose value differs between before and after (a field only on one side counts);
    fields that did not change are left out."""
    before, after = before or {}, after or {}
    if not isinstance(before, dict) or not isinstance(after, dict):
        return [Change("value", _show(before), _show(after))]
    out = []
    for key in list(before) + [k for k in after if k not in before]:
        a, b = before.get(key), after.get(key)
        if a != b:
            out.append(Change(key, _show(a) if key in before else "—",
                              _show(b) if key in after else "—"))
    return out


def _endpoint(op: str, model: str, before: dict, after: dict) -> str:
    verb = ENDPOINT_VERBS.get(op, op.replace("-", " ").replace(".", " "))
    was, now = before.get("stable"), after.get("stable")
    if op in ("deploy", "promote"):
        text = f"{verb} {_v(now)} of {model}"
        return text + (f" (was {_v(was)})" if was and was != now else "")
    if op == "canary":
        weight = after.get("candidate_weight")
        return (f"{verb} {_v(after.get('candidate'))} on {model}"
                + (f" at {weight} %" if weight is not None else ""))
    if op == "weight":
        return (f"{verb} {model} from {before.get('candidate_weight')} % to "
                f"{after.get('candidate_weight')} %")
    if op in ("rollback", "rollback-load"):
        return f"{verb} {model} to {_v(now)}" + (f" (was {_v(was)})" if was and was != now else "")
    return f"{verb} {model}"


def _config_search(op: str, actor: str, what: str, after: dict) -> str:
    search = f"config search {after.get('search', '')}"
    if op == "create":
        return (f"{actor} started {search} of {what} ({after.get('points')} points × "
                f"{after.get('seconds')} s)")
    if op == "cancel":
        return f"{actor} cancelled {search} of {what}"
    if op == "apply":
        return f"{actor} applied point #{after.get('point')} of {search} to {what}"
    best = after.get("best")
    return (f"{search} of {what} {op}" + (f", best point #{best}" if best is not None else "")
            + (f": {_brief(after['reason'])}" if after.get("reason") else ""))


def describe(event) -> str:
    """'admin promoted v3 of scorer (was v2), reason “…”' — who did what, in words."""
    action, actor = event.action, event.actor_name or "someone"
    before, after = event.before or {}, event.after or {}
    if not isinstance(before, dict):
        before = {}
    if not isinstance(after, dict):
        after = {}
    model = event.model_name or event.target
    number = event.target.rsplit(":", 1)[-1] if ":" in event.target else ""
    if action.endswith(".refused"):
        op = action[len("endpoint."):-len(".refused")] if action.startswith("endpoint.") else action
        text = f"{actor} was refused: {op} on {model} ({after.get('error', 'refused')})"
    elif action.startswith("endpoint."):
        text = f"{actor} " + _endpoint(action[len("endpoint."):], model, before, after)
    elif action == "version.upload":
        text = (f"{actor} uploaded v{after.get('number', number)} of {model}"
                + (f" ({after['filename']})" if after.get("filename") else ""))
    elif action == "version.pipeline":
        steps = (after.get("pipeline") or {}).get("steps") or []
        text = (f"{actor} created pipeline v{after.get('number', number)} of {model}: "
                + " · ".join(f"{s.get('name')} = {s.get('model')} v{s.get('version')}"
                             for s in steps if isinstance(s, dict)))
    elif action == "version.ready":
        text = f"v{number} of {model} passed validation and is ready"
    elif action == "version.failed":
        text = (f"v{number} of {model} failed validation: "
                f"{_brief(after.get('reason') or 'no reason')}")
    elif action == "version.weights-hash":
        text = (f"the weights hash of v{number} of {model} was filled in"
                if after.get("weights_sha256") else
                f"the weights of v{number} of {model} cannot be hashed: "
                f"{_brief(after.get('unhashable') or 'unknown')}")
    elif action == "version.configure":
        text = f"{actor} changed the serving settings of v{number} of {model}"
    elif action.startswith("version.tensorrt."):
        text = f"TensorRT engine for v{number} of {model}: {action.rsplit('.', 1)[-1]}"
    elif action == "alias.set":
        alias = after.get("alias", event.target)
        text = (f"{actor} pointed alias {alias} of {model} at {_v(after.get('version'))}"
                + (f" (was {_v(before['version'])})" if before.get("version") else ""))
    elif action == "alias.remove":
        text = (f"{actor} removed alias {before.get('alias', event.target)} of {model} "
                f"(was {_v(before.get('version'))})")
    elif action == "job.create":
        text = (f"{actor} started a {after.get('kind', '')} job on {_v(after.get('version'))} "
                f"of {model}")
    elif action.startswith("job."):
        status = action.split(".", 1)[1]
        rows = after.get("rows")
        of = f" of {event.model_name}" if event.model_name else ""
        text = (f"{after.get('kind', '')} job {event.target[:8]} on {_v(after.get('version'))}"
                f"{of} {status}" + (f" after {rows:,} rows" if rows else "")
                + (f": {_brief(after['reason'])}" if after.get("reason") else ""))
    elif action.startswith("config_search."):
        text = _config_search(action.split(".", 1)[1], actor, f"v{number} of {model}", after)
    elif action == "webhook.update" and set(after) >= {"active"} and \
            before.get("active") != after.get("active"):
        text = f"{actor} {'enabled' if after['active'] else 'disabled'} webhook {event.target}"
    elif action in SIMPLE:
        text = f"{actor} " + SIMPLE[action].format(target=event.target, model=model,
                                                   short=event.target[:8])
    else:
        text = f"{actor} {action} {event.target}"
    if event.reason:
        text += f", reason “{event.reason}”"
    return text
