"""Jobs pages (engineer: inputs and predictions are data, as in the API): async inferences and
batch transforms with live progress (rows done / total, rows/s, ETA), cancel, result download."""

from __future__ import annotations

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from registry import selectors
from registry.jobs.progress import progress, result_url
from registry.models import JobKind, JobStatus
from registry.services import jobs as job_services

from ..forms import ReasonForm, error_text
from . import render_page_or_partial
from .access import requires, run_service
from .models import found

PAGE_SIZE = 25


def _row(job) -> dict:
    return {"job": job, "progress": progress(job), "active": not job.finished,
            "result_url": result_url(job)}


@require_GET
@requires("engineer")
def job_list(request: HttpRequest) -> HttpResponse:
    filters = {k: request.GET.get(k, "").strip() for k in ("kind", "status", "model")}
    if filters["kind"] not in ("", *JobKind.values):
        filters["kind"] = ""
    if filters["status"] not in ("", *JobStatus.values):
        filters["status"] = ""
    page = Paginator(selectors.job_list(**filters, user=request.user),
                     PAGE_SIZE).get_page(request.GET.get("page"))
    rows = [_row(j) for j in page]
    query = request.GET.copy()
    query.pop("page", None)
    context = {"page": page, "rows": rows, "filters": filters, "query": query.urlencode(),
               "kinds": JobKind.values, "statuses": JobStatus.values,
               "polling": any(r["active"] for r in rows), "nav": "jobs"}
    return render_page_or_partial(request, "console/job_list.html",
                                  "console/partials/job_table.html", context)


@require_GET
@requires("engineer")
def job_detail(request: HttpRequest, job_id) -> HttpResponse:
    job = found(selectors.job_get, job_id, request.user)
    context = {**_row(job), "nav": "jobs", "form": ReasonForm()}
    return render_page_or_partial(request, "console/job_detail.html",
                                  "console/partials/job_progress.html", context)


@require_POST
@requires("engineer")
def job_cancel(request: HttpRequest, job_id) -> HttpResponse:
    job = found(selectors.job_get, job_id, request.user)
    form = ReasonForm(request.POST)
    if not form.is_valid():
        messages.error(request, error_text(form))
    else:
        run_service(request, job_services.job_cancel, job_id=job.pk,
                    reason=form.cleaned_data.get("reason", ""),
                    success="Job cancelled: the worker stops within a chunk and removes its "
                            "partial output.")
    return redirect("console:job-detail", job_id=job.pk)
