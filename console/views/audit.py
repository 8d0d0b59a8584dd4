"""The audit log (global admins: all of it; a team's admins: that team's part): filtered with
the API's AuditFilterSet, exported as CSV."""

from __future__ import annotations

import csv
import json

from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from registry import selectors
from registry.filtersets import AuditFilterSet
from registry.roles import is_admin
from registry.services.lockouts import active_lockouts

from . import render_page_or_partial
from .access import requires

PAGE_SIZE = 50
CSV_FIELDS = ("created_at", "actor_name", "action", "target_type", "target", "model_name",
              "reason", "before", "after", "request_id", "client_address")


def _events(request: HttpRequest):
    if not selectors.may_read_audit(request.user):
        raise PermissionDenied("reading the audit log needs the admin role (global, or in a "
                               "team)")
    return selectors.audit_list(request.user)


@require_GET
@requires("viewer")
def audit_list(request: HttpRequest) -> HttpResponse:
    filterset = AuditFilterSet(request.GET, queryset=_events(request))
    page = Paginator(filterset.qs, PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = {"filter": filterset, "page": page, "query": query.urlencode(),
               "lockouts": [] if request.htmx or not is_admin(request.user)
               else active_lockouts()}
    return render_page_or_partial(request, "console/audit_list.html",
                                  "console/partials/audit_table.html", context,
                                  status=200 if filterset.is_valid() else 400, partial_status=200)


#: A spreadsheet runs a cell that starts with one of these as a formula (OWASP: CSV injection).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def neutralise(value) -> str:
    """One cell of the export: a leading quote makes a would-be formula plain text. Not
    defusedcsv: it leaves cells starting with a tab or carriage return alone."""
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


class _Echo:
    """csv.writer wants a file; StreamingHttpResponse wants an iterator of lines."""

    def write(self, value: str) -> str:
        return value


def _csv_rows(queryset):
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_FIELDS)
    for event in queryset.iterator(chunk_size=500):
        row = []
        for field in CSV_FIELDS:
            value = getattr(event, field)
            if field in ("before", "after"):
                value = "" if value is None else json.dumps(value, sort_keys=True)
            elif field == "created_at":
                value = value.isoformat()
            row.append(neutralise(value))
        yield writer.writerow(row)


@require_GET
@requires("viewer")
def audit_csv(request: HttpRequest) -> HttpResponse:
    filterset = AuditFilterSet(request.GET, queryset=_events(request))
    if not filterset.is_valid():
        return HttpResponse("invalid filter: " + filterset.errors.as_text(), status=400,
                            content_type="text/plain")
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response = StreamingHttpResponse(_csv_rows(filterset.qs), content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="audit-{stamp}.csv"'
    return response
