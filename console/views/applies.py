"""The applies of mmc.yaml (engineer: they are deployments): the latest first, each with its
diff as the audit log keeps it (registry.services.as_code writes one event per apply that changed
something, and one per refused apply). A webhook change shows to admins only, as webhooks do; a
team member sees the applies that changed their teams' models, and only those changes."""

from __future__ import annotations

import json

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from registry import selectors
from registry.roles import has_role, visible_model_names
from registry.services.as_code import APPLY, REFUSED

from . import render_page_or_partial
from .access import requires

PAGE_SIZE = 20
MARKS = {"create": "+", "update": "~", "delete": "−"}


def _shown(value) -> str:
    return "—" if value is None else json.dumps(value, separators=(", ", ": "))


def _change(change: dict) -> dict:
    before, after = change.get("before") or {}, change.get("after") or {}
    return {"resource": change.get("resource", ""), "action": change.get("action", ""),
            "mark": MARKS.get(change.get("action"), "?"), "steps": change.get("steps") or [],
            "fields": [{"key": key, "before": _shown(before.get(key)),
                        "after": _shown(after.get(key)),
                        "same": key in before and key in after and before[key] == after[key]}
                       for key in dict.fromkeys([*before, *after])]}


def model_of(resource: str) -> str | None:
    """The model a change's resource is about ("alias fraud@prod" -> "fraud"); None for a
    webhook."""
    kind, _, rest = resource.partition(" ")
    if kind == "webhook":
        return None
    return rest.split(":")[0].split("@")[0]


def _may_see(resource: str, admin: bool, names: set[str] | None) -> bool:
    if admin or names is None:
        return True
    model = model_of(resource)
    return model is not None and model in names


def _row(event, admin: bool, names: set[str] | None = None) -> dict:
    after = event.after if isinstance(event.after, dict) else {}
    changes = [c for c in after.get("changes") or [] if isinstance(c, dict)]
    shown = [_change(c) for c in changes
             if _may_see(str(c.get("resource", "")), admin, names)]
    return {"event": event, "refused": event.action == REFUSED, "source": after.get("source"),
            "sha256": after.get("sha256") or "", "prune": bool(after.get("prune")),
            "summary": after.get("summary") or {}, "error": after.get("error") or "",
            "changes": shown, "hidden": len(changes) - len(shown)}


def _visible(event, user, names: set[str]) -> bool:
    """An apply shows to a team member when it changed one of the team's models; a refused
    one when its file named one of them, or to the user who tried it."""
    after = event.after if isinstance(event.after, dict) else {}
    if event.action == REFUSED:
        return event.actor_id == user.pk or bool(set(after.get("models") or ()) & names)
    changes = after.get("changes") or []
    return any(isinstance(c, dict) and model_of(str(c.get("resource", ""))) in names
               for c in changes)


@require_GET
@requires("engineer")
def apply_list(request: HttpRequest) -> HttpResponse:
    events = selectors.audit_list().filter(action__in=(APPLY, REFUSED))
    admin = has_role(request.user, "admin")
    names = visible_model_names(request.user)
    if names is not None:  # another team's applies stay out of sight (the latest 1,000 read)
        events = [e for e in events[:1000] if _visible(e, request.user, names)]
    page = Paginator(events, PAGE_SIZE).get_page(request.GET.get("page"))
    context = {"page": page, "rows": [_row(e, admin, names) for e in page], "nav": "applies",
               "query": ""}
    return render_page_or_partial(request, "console/applies.html",
                                  "console/partials/apply_table.html", context)
