"""Data capture in the console: the deployment page's capture card (settings, records captured
and dropped, a form for engineers), the version page's last captured requests, and replay of
one captured request against another version, answers side by side."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from django import forms
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from registry import selectors
from registry.errors import RegistryError
from registry.models import ModelVersion, VersionStatus
from registry.monitoring import capture_store
from registry.monitoring.capture import RECENT_WINDOW_S, capture_status, recent_records
from registry.roles import has_role
from registry.services.capture import MODES, capture_set

from .access import requires, run_service
from .models import found

#: The captured requests the version page lists.
RECENT = 20


class CaptureForm(forms.Form):
    """An endpoint's capture settings; registry.services.capture checks the ranges."""

    percent = forms.DecimalField(label="Sampling (%)", help_text="0 to 100; 0: off")
    mode = forms.ChoiceField(label="Record", choices=[(m, m) for m in MODES])
    max_bytes = forms.IntegerField(label="Byte cap per request",
                                   help_text="tensors past it are left out")
    retention_days = forms.IntegerField(label="Keep (days)")

    @classmethod
    def of(cls, status: dict, data=None) -> CaptureForm:
        initial = {k: status[k] for k in ("mode", "max_bytes", "retention_days")}
        return cls(data, auto_id="cap-%s", initial={**initial, "percent": f"{status['percent']:g}"})


def _card(request: HttpRequest, model, *, form: CaptureForm | None = None,
          status: int = 200) -> HttpResponse:
    settings = capture_status(selectors.endpoint_get(model), model.name)
    context = {"model": model, "capture": settings, "percent_text": f"{settings['percent']:g}",
               "capture_form": form or CaptureForm.of(settings),
               "can_write": has_role(request.user, "engineer") and not model.archived}
    return render(request, "monitoring/capture_card.html", context, status=status)


@require_http_methods(["GET", "POST"])
@requires("viewer")
def capture_card(request: HttpRequest, name: str) -> HttpResponse:
    """GET: the card (htmx, after the page). POST: new settings from its form; the card again
    (htmx) or the deployment page, with what went wrong as a 400."""
    model = found(selectors.model_get, name)
    if request.method == "GET":
        return _card(request, model)
    form = CaptureForm(request.POST, auto_id="cap-%s")
    done = None
    if not form.is_valid():
        for field, errors in form.errors.items():
            messages.error(request, f"Data capture: {form.fields[field].label}: "
                                    f"{' '.join(errors)}")
    else:
        done = run_service(request, capture_set, model_name=name,
                           values={k: v for k, v in form.cleaned_data.items()},
                           success=f"Data capture of {name} saved; replicas follow at the next "
                                   "route revision.")
    if request.headers.get("HX-Request"):
        return _card(request, model, form=form if done is None else None,
                     status=200 if done is not None else 400)
    return redirect(reverse("console:deployment", kwargs={"name": name}) + "#capture")


def _version(name: str, number: int) -> ModelVersion:
    model = found(selectors.model_get, name)
    version = model.versions.filter(number=number).first()
    if version is None:
        raise Http404(f"model {name!r} has no version {number}")
    return version


@require_GET
@requires("viewer")
def captured_list(request: HttpRequest, name: str, number: int) -> HttpResponse:
    """The version page's last captured requests (htmx, after the page), newest first."""
    version = _version(name, number)
    try:
        records = recent_records(name, number, limit=RECENT)
    except RegistryError as exc:
        records, error = [], exc.message
    else:
        error = None
    others = list(version.model.versions.filter(status=VersionStatus.READY)
                  .exclude(number=number).order_by("-number").values_list("number", flat=True))
    rows = [{"id": r["id"], "role": r.get("role"), "at": datetime.fromtimestamp(r["ts"], UTC),
             "latency_ms": r.get("latency_ms"), "truncated": r.get("truncated"),
             "inputs": ", ".join(r.get("inputs") or {}) or "—",
             "outputs": ", ".join(r.get("outputs") or {}) or "—",
             "replayable": bool(r.get("inputs")) and not r.get("truncated")}
            for r in records]
    return render(request, "monitoring/captured_list.html", {
        "model": version.model, "version": version, "rows": rows, "others": others,
        "error": error, "limit": RECENT, "window_days": RECENT_WINDOW_S // 86400})


def tensors_text(tensors: dict, values: int = 40) -> str:
    """Tensors as the replay page prints them: name, type, shape and the first values."""
    lines = []
    for name, t in tensors.items():
        data = t.get("data") or []
        shown = ", ".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in data[:values])
        more = f", … ({len(data)} values)" if len(data) > values else ""
        lines.append(f"{name}  {t.get('datatype')} {t.get('shape')}\n[{shown}{more}]")
    return "\n".join(lines)


def _v2_inputs(tensors: dict) -> list[dict]:
    return [{"name": n, "datatype": t["datatype"], "shape": t["shape"], "data": t["data"]}
            for n, t in tensors.items()]


@require_GET
@requires("viewer")
def capture_replay(request: HttpRequest, name: str, number: int,
                   request_id: str) -> HttpResponse:
    """One captured request of v<number> and what it answered; the page runs its inputs on
    another ready version (the `against` one) from the browser, as Try it does, and shows both
    answers side by side."""
    version = _version(name, number)
    now = time.time()
    record = capture_store.find(name, request_id, since=now - RECENT_WINDOW_S, until=now,
                                version=number)
    if record is None:
        raise Http404(f"no captured request {request_id!r} of {name} v{number} in the last "
                      f"{RECENT_WINDOW_S // 86400} days")
    others = list(version.model.versions.filter(status=VersionStatus.READY)
                  .exclude(number=number).order_by("-number").values_list("number", flat=True))
    against = request.GET.get("against", "")
    against = int(against) if against.isdigit() and int(against) in others else (
        others[0] if others else None)
    replayable = bool(record.get("inputs")) and not record.get("truncated")
    body = {"id": f"replay-{request_id}"[:128], "inputs": _v2_inputs(record.get("inputs") or {})}
    access = selectors.endpoint_access(selectors.endpoint_get(version.model))
    return render(request, "monitoring/replay.html", {
        "model": version.model, "version": version, "record": record, "others": others,
        "against": against, "replayable": replayable, "replay_body": body,
        "captured_outputs": record.get("outputs") or {}, "access": access, "nav": "models",
        "captured_text": tensors_text(record.get("outputs") or {}),
        "inputs_text": tensors_text(record.get("inputs") or {}),
        "captured_at": datetime.fromtimestamp(record["ts"], UTC),
        "infer_url": f"/v2/models/{name}/versions/{against}/infer" if against else "",
    })
