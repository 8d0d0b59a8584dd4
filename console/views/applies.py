"""The applies of mmc.yaml (engineer: they are deployments): the latest first, each with its
diff as the audit log keeps it (registry.services.as_code writes one event per apply that changed
something, and one per refused apply). A webhook change shows to admins only, as webhooks do."""

from __future__ import annotations

import json

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from registry import selectors
from registry.roles import has_role
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


def _row(event, admin: bool) -> dict:
    after = event.after if isinstance(event.after, dict) else {}
    changes = [c for c in after.get("changes") or [] if isinstance(c, dict)]
    shown = [_change(c) for c in changes
             if admin or not str(c.get("resource", "")).startswith("webhook ")]
    return {"event": event, "refused": event.action == REFUSED, "source": after.get("source"),
            "sha256": after.get("sha256") or "", "prune": bool(after.get("prune")),
            "summary": after.get("summary") or {}, "error": after.get("error") or "",
            "changes": shown, "hidden": len(changes) - len(shown)}


@require_GET
@requires("engineer")
def apply_list(request: HttpRequest) -> HttpResponse:
    events = selectors.audit_list().filter(action__in=(APPLY, REFUSED))
    page = Paginator(events, PAGE_SIZE).get_page(request.GET.get("page"))
    admin = has_role(request.user, "admin")
    context = {"page": page, "rows": [_row(e, admin) for e in page], "nav": "applies",
               "query": ""}
    return render_page_or_partial(request, "console/applies.html",
                                  "console/partials/apply_table.html", context)
