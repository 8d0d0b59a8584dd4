"""The deployment page of one model: traffic split and the rollout buttons (each one a registry
service), live per-version charts, replica convergence, the automated canary plan, shadow."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_GET, require_POST

from registry import metrics, selectors, services
from registry.models import AuditEvent, ModelVersion
from registry.notify import current_revision
from registry.roles import has_role
from registry.routing import Routing
from registry.services import analysis_watch
from registry.services.deployments import ALLOWED, EMPTY, endpoint_state
from registry.ticks import TickAge, tick_age

from .. import charts
from ..forms import (
    BlueGreenDeployForm,
    CanaryForm,
    LimitsForm,
    PredictKeyForm,
    ReasonForm,
    RollbackForm,
    ScaleToZeroForm,
    ShadowStartForm,
    WeightForm,
    error_text,
)
from .access import requires, run_service
from .models import found


# The chart range picker: seconds shown, history tier read (registry/metrics_retention.py),
# seconds one chart point covers (at most ~360 points: a 308 px plot cannot show more) and how
# often the charts redraw (a week's chart changes once a minute at most).
@dataclass(frozen=True)
class ChartRange:
    key: str
    label: str
    seconds: int
    level: int
    point: int
    poll: str
    end: float | None = None  # a custom range ends here (unix seconds); the others end now
    start_text: str = ""      # a custom range's bounds as typed (datetime-local)
    end_text: str = ""

    @property
    def query(self) -> str:
        """The query string that picks this range again (polls and the page's own URL)."""
        if self.key == "custom":
            return urlencode({"range": "custom", "from": self.start_text, "to": self.end_text})
        return urlencode({"range": self.key})


RANGES = {r.key: r for r in (
    ChartRange("15m", "15 min", 900, 0, 0, "2s"),  # one point per bucket
    ChartRange("1h", "1 hour", 3600, 0, 10, "5s"),
    ChartRange("6h", "6 hours", 6 * 3600, 1, 60, "30s"),
    ChartRange("24h", "24 hours", 24 * 3600, 2, 600, "60s"),  # the 10-minute tier: 144 points
    ChartRange("7d", "7 days", 7 * 24 * 3600, 2, 1800, "60s"),
)}
MAX_POINTS = 360  # a 308 px plot shows no more
NICE_POINTS = (5, 10, 30, 60, 120, 300, 600, 1800, 3600, 3 * 3600)


class ChartRangeError(ValueError):
    """A custom range that cannot be drawn; the message says why."""


def custom_range(start_text: str, end_text: str, *, now: float | None = None) -> ChartRange:
    """From/to as typed in the picker (the console's time zone): the finest tier that still
    holds the start, and a point width that keeps the chart under MAX_POINTS."""
    now = time.time() if now is None else now
    bounds = []
    for name, text in (("from", start_text), ("to", end_text)):
        try:
            moment = parse_datetime(text or "")
        except ValueError:
            moment = None
        if moment is None:
            raise ChartRangeError(f"custom range: '{name}' must be a date and time such as "
                                  f"2026-11-23T14:00, not {text!r}")
        if timezone.is_naive(moment):
            moment = timezone.make_aware(moment)
        bounds.append(moment.timestamp())
    start, end = bounds
    if end <= start:
        raise ChartRangeError("custom range: 'from' must be before 'to'")
    if end - start < 60:
        raise ChartRangeError("custom range: pick at least one minute")
    if start < now - settings.METRICS_RETENTION_SECONDS:
        days = settings.METRICS_RETENTION_SECONDS / 86400
        raise ChartRangeError(f"custom range: history is kept for {days:g} days; "
                              f"'from' is older than that")
    end = min(end, now)
    seconds = int(end - start)
    if start >= now - settings.METRICS_FINE_SECONDS:
        level = 0
    elif start >= now - settings.METRICS_MINUTE_SECONDS:
        level = 1
    else:
        level = 2
    want = seconds / MAX_POINTS
    point = next((p for p in NICE_POINTS if p >= want), NICE_POINTS[-1])
    label = " – ".join(timezone.localtime(datetime.fromtimestamp(t, tz=UTC)).strftime(
        "%d %b %H:%M") for t in (start, end))
    return ChartRange("custom", label, seconds, level, point, "600s", end=end,
                      start_text=start_text, end_text=end_text)


DEFAULT_RANGE = "15m"
# Audit actions drawn as markers on the charts, with what each marker says.
ROLLOUT_EVENTS = {
    "endpoint.deploy": "deploy", "endpoint.canary": "canary start",
    "endpoint.weight": "weight change", "endpoint.analysis.advance": "weight change (analysis)",
    "endpoint.promote": "promote", "endpoint.abort": "abort", "endpoint.rollback": "rollback",
    "endpoint.bg-deploy": "blue-green deploy", "endpoint.switch": "switch",
    "endpoint.switch-back": "switch back", "endpoint.bg-finish": "blue-green finish",
}
NARROW = 25  # a traffic segment under this % is too narrow for its label: it goes under the bar
DECISIONS_SHOWN = 12


@dataclass(frozen=True)
class Action:
    """A button on the page: the state-machine op that allows it, its form and its service."""

    op: str
    form: type[forms.Form]
    service: object
    success: str


ACTIONS: dict[str, Action] = {a.op: a for a in (
    Action("canary", CanaryForm, services.canary_start,
           "Canary started: version {version} is the candidate."),
    Action("weight", WeightForm, services.canary_weight,
           "The candidate now takes {weight} % of traffic."),
    Action("promote", ReasonForm, services.canary_promote,
           "Candidate promoted: it is the stable version now."),
    Action("abort", ReasonForm, services.canary_abort,
           "Canary aborted: all traffic is back on the stable version."),
    Action("pause", ReasonForm, services.analysis_pause,
           "Automated analysis paused: set the weights by hand."),
    Action("resume", ReasonForm, services.analysis_resume,
           "Automated analysis resumed at its current step."),
    Action("rollback", RollbackForm, services.rollback,
           "Rolled back: version {version} is the stable version now."),
    Action("bg-deploy", BlueGreenDeployForm, services.bluegreen_deploy,
           "Version {version} deployed to the idle colour; replicas are loading it."),
    Action("switch", ReasonForm, services.bluegreen_switch,
           "Switched: the other colour takes all traffic."),
    Action("switch-back", ReasonForm, services.bluegreen_switch_back,
           "Switched back to the previous colour."),
    Action("bg-finish", ReasonForm, services.bluegreen_finish,
           "Blue-green finished: the live version is the plain stable."),
    Action("shadow-start", ShadowStartForm, services.shadow_start,
           "Version {version} now receives a shadow copy of live traffic."),
    Action("shadow-stop", ReasonForm, services.shadow_stop, "Shadow stopped."),
)}


def _page_url(name: str) -> str:
    return reverse("console:deployment", kwargs={"name": name})


def routing_of(ep) -> Routing[ModelVersion]:
    """The endpoint's routing over its version rows (those the page shows)."""
    rows = {v.pk: v for v in (ep.stable, ep.candidate, ep.blue, ep.green) if v is not None}
    return ep.routing.map(rows.get)


def serving_versions(ep) -> list[tuple[ModelVersion, str]]:
    """(version, role) for every version taking or about to take traffic, stable first."""
    if ep is None:
        return []
    routing = routing_of(ep)
    if routing.live_color:
        pairs = [(routing.live, f"{routing.live_color}, live"),
                 (routing.idle, f"{routing.idle_color}, idle")]
    else:
        pairs = [(routing.stable, "stable"), (routing.candidate, "candidate")]
    seen, out = set(), []
    for version, role in pairs:
        if version is not None and version.pk not in seen:
            seen.add(version.pk)
            out.append((version, role))
    return out


def traffic_split(ep) -> list[dict]:
    if ep is None:
        return []
    return [{"version": version.number, "weight": weight,
             "role": role if role in ("stable", "candidate") else f"{role} (live)"}
            for role, version, weight in routing_of(ep).split()]


def complete_buckets(points: list[dict], now: float, width: float | None = None) -> list[dict]:
    """Drop the point whose first bucket is still filling: replicas yet to report in it would
    read as a sudden drop at the right edge. A wider point (10 min at 24 h) is drawn once a
    bucket of it is complete: every replica's rate is in it, over the seconds it has run."""
    fill = min(width or settings.METRICS_BUCKET_SECONDS, settings.METRICS_BUCKET_SECONDS)
    return [p for p in points if p["t"] + fill <= now]


def chart_range(request: HttpRequest) -> ChartRange:
    """The range picked by ?range= (an unknown one reads as the default); a custom one raises
    ChartRangeError saying what is wrong with its bounds."""
    if request.GET.get("range") == "custom":
        return custom_range(request.GET.get("from", ""), request.GET.get("to", ""))
    return RANGES.get(request.GET.get("range", ""), RANGES[DEFAULT_RANGE])


def _event_text(event: AuditEvent) -> str:
    after = event.after or {}
    label = ROLLOUT_EVENTS[event.action]
    if event.action in ("endpoint.canary", "endpoint.weight", "endpoint.analysis.advance"):
        return f"{label}: v{after.get('candidate')} at {after.get('candidate_weight')} %"
    if event.action.startswith(("endpoint.switch", "endpoint.bg-")):
        return f"{label}: v{after.get('live')} live"
    return f"{label}: v{after.get('stable')} stable"


def rollout_events(model_name: str, since: datetime,
                   until: datetime | None = None) -> list[charts.Event]:
    """The audit log's rollout changes in [since, until], oldest first, numbered."""
    rows = AuditEvent.objects.filter(model_name=model_name, target_type="endpoint",
                                     action__in=ROLLOUT_EVENTS, created_at__gte=since)
    if until is not None:
        rows = rows.filter(created_at__lte=until)
    return [charts.Event(n=i, t=e.created_at.timestamp(), text=_event_text(e), when=e.created_at)
            for i, e in enumerate(rows.order_by("created_at", "id"), 1)]


def chart_context(model_name: str, ep, picked: ChartRange | None = None) -> dict:
    """One version_series per version with history in the range: the serving ones (stable
    first) and those no longer routed (promoted over, rolled back), which keep their line."""
    picked = picked or RANGES[DEFAULT_RANGE]
    now = picked.end or time.time()
    width = max(picked.point, metrics.point_seconds(picked.level))
    serving = [(v.number, role) for v, role in serving_versions(ep)]
    numbers = {n for n, _ in serving}
    retired = [(n, "retired") for n in metrics.versions_recorded(
        model_name, seconds=picked.seconds, level=picked.level, now=now) if n not in numbers]
    series = [charts.Series(label=f"v{n} {role}", points=complete_buckets(metrics.version_series(
                  model_name, n, seconds=picked.seconds, level=picked.level, now=now,
                  step=width), now, width))
              for n, role in serving + retired]
    end = datetime.fromtimestamp(now, tz=UTC)
    events = rollout_events(model_name, end - timedelta(seconds=picked.seconds), end)
    end_label = timezone.localtime(end).strftime("%d %b %H:%M") if picked.end else "now"
    return {"charts": charts.version_charts(series, seconds=picked.seconds, now=now,
                                            events=events, end_label=end_label),
            "events": events, "chart_range": picked, "ranges": RANGES.values(),
            "point_label": f"{width} s" if width < 60 else f"{width // 60} min",
            "shadow": metrics.latest_shadow(model_name) if ep and ep.shadow_id else None,
            "shadow_version": ep.shadow.number if ep and ep.shadow else None}


def _age(moment: datetime | None, now: datetime) -> float | None:
    return None if moment is None else max((now - moment).total_seconds(), 0.0)


def replica_rows(model_name: str, revision: int) -> tuple[list[dict], dict]:
    """Every replica, live or lost (a lost one stays until removed or forgotten)."""
    now, prefix = timezone.now(), f"{model_name}:"
    rows = []
    for r in selectors.replicas(include_lost=True):
        versions = []
        for key, state in sorted((r.versions or {}).items()):
            if key.startswith(prefix):
                versions.append({"version": key[len(prefix):], "state": state.get("state"),
                                 "label": (state.get("state") or "").lower().replace("_", " "),
                                 "reason": state.get("reason"),
                                 "queue_depth": state.get("queue_depth"),
                                 "providers": state.get("providers") or []})
        rows.append({"replica": r.replica, "address": r.address, "revision": r.revision,
                     "applied": r.revision >= revision, "versions": versions,
                     "queue_depth": sum(v["queue_depth"] or 0 for v in versions),
                     "age": _age(r.last_seen, now), "lost": r.lost, "lost_since": r.lost_since,
                     "degraded": r.degraded})
    live = [row for row in rows if not row["lost"]]
    summary = {"live": len(live), "at_revision": sum(row["applied"] for row in live),
               "revision": revision, "lost": len(rows) - len(live)}
    return rows, summary


def analysis_context(ep) -> dict | None:
    analysis = ep.rollout.analysis if ep else None
    if not analysis:
        return None
    plan, step = analysis.plan, analysis.step
    baked = _age(analysis.step_started_at, timezone.now()) or 0.0
    return {"plan": plan, "step": step, "paused": analysis.paused, "held": analysis.held,
            "steps": [{"weight": w, "state": "done" if i < step else
                       "current" if i == step else "next"} for i, w in enumerate(plan.steps)],
            "baked_seconds": round(baked), "bake_seconds": round(plan.bake_seconds),
            "bake_left": max(round(plan.bake_seconds - baked), 0)}


def decisions(model_name: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(model_name=model_name, target_type="endpoint")
                .order_by("-created_at", "-id")[:DECISIONS_SHOWN])


def watched_endpoint(model):
    """The model's endpoint, read after a stale canary analysis was noticed (any running one
    then drops its candidate to 0 %, registry.services.analysis_watch), and the tick's age."""
    tick = tick_age()
    analysis_watch.drop_stale(found=tick)
    return selectors.endpoint_get(model), tick


def live_context(request: HttpRequest, model, ep, tick: TickAge | None = None) -> dict:
    revision = current_revision()
    rows, summary = replica_rows(model.name, revision)
    split = traffic_split(ep)
    return {"model": model, "endpoint": ep, "state": endpoint_state(ep) if ep else EMPTY,
            "split": split, "split_narrow": any(0 < s["weight"] < NARROW for s in split),
            "replica_rows": rows, "convergence": summary,
            "analysis": analysis_context(ep), "tick": tick,
            "decisions": decisions(model.name),
            "page_revision": request.GET.get("rev"),
            "endpoint_revision": ep.revision if ep else 0}


def _choices(model, ep) -> dict:
    """Version pickers: only the versions that may take traffic (the one gate's rule, as
    selectors.traffic_versions reads it), so no picker offers what the service would refuse."""
    ready = [v.number for v in selectors.traffic_versions(model)]
    stable = ep.stable.number if ep and ep.stable else None
    live = ep.live_version if ep else None
    live_n = live.number if live else None
    shadow = ep.shadow.number if ep and ep.shadow else None
    return {
        "canary_choices": [n for n in ready if n != stable],
        "rollback_choices": [n for n in ready if stable is not None and n < stable],
        "bg_choices": [n for n in ready if n != live_n],
        "shadow_choices": [n for n in ready if n not in (live_n, shadow)],
        "ready_count": len(ready),
    }


def control_forms(choices: dict, ep) -> dict:
    """The unbound forms the controls render (each field's id starts with its form's name)."""
    return {
        "canary_form": CanaryForm(auto_id="canary-%s", versions=choices["canary_choices"]),
        "weight_form": WeightForm(auto_id="weight-%s", initial={
            "weight": ep.candidate_weight if ep and ep.candidate else None}),
        "rollback_form": RollbackForm(auto_id="rollback-%s",
                                      versions=choices["rollback_choices"]),
        "bg_form": BlueGreenDeployForm(auto_id="bg-%s", versions=choices["bg_choices"]),
        "shadow_form": ShadowStartForm(auto_id="shadow-%s", versions=choices["shadow_choices"]),
    }


def controls_context(request: HttpRequest, model, ep) -> dict:
    """What the rollout controls need: the buttons the state allows this user, the pickers."""
    state = endpoint_state(ep) if ep else EMPTY
    choices = _choices(model, ep)
    return {
        **choices,
        **control_forms(choices, ep),
        "can_write": has_role(request.user, "engineer") and not model.archived,
        "allowed": {op for op, states in ALLOWED.items() if state in states},
        "page_revision": str(ep.revision if ep else 0),
        "bg_switched": bool(ep and ep.rollout.blue_green and ep.rollout.blue_green.switched_at),
    }


def render_deployment(request: HttpRequest, name: str, *, new_key: dict | None = None,
                      key_form: PredictKeyForm | None = None, status: int = 200) -> HttpResponse:
    """The whole page; `new_key` (just created: shown once) and `key_form` (with its errors)
    come from the predict key form (console/views/keys.py)."""
    model = found(selectors.model_get, name)
    ep, tick = watched_endpoint(model)
    context = live_context(request, model, ep, tick)  # the charts load right after
    access = selectors.endpoint_access(ep)
    for key in access.keys:
        key.limits_form = LimitsForm.of(key, f"kl-{key.prefix}")
    context.update(controls_context(request, model, ep), nav="models",
                   access=access, new_key=new_key,
                   key_form=key_form or PredictKeyForm(auto_id="key-%s"),
                   limits_form=LimitsForm.of(ep, "limits"),
                   scale_form=ScaleToZeroForm.of(ep),
                   cold_starts=selectors.cold_starts(model.name))
    try:
        picked = chart_range(request)
    except ChartRangeError as e:
        picked, status = RANGES[DEFAULT_RANGE], 400
        context["range_error"] = str(e)
    context.update(chart_range=picked, ranges=RANGES.values())
    response = render(request, "console/deployment.html", context, status=status)
    if new_key:
        response["Cache-Control"] = "no-store"
    return response


@require_GET
@requires("viewer")
def deployment_page(request: HttpRequest, name: str) -> HttpResponse:
    return render_deployment(request, name)


@require_GET
@requires("viewer")
def deployment_charts(request: HttpRequest, name: str) -> HttpResponse:
    """The charts and the shadow comparison alone: polled (every 2 s for the last 15 min), or
    redrawn for the range picked (?range=24h)."""
    model = found(selectors.model_get, name)
    ep = selectors.endpoint_get(model)
    try:
        picked = chart_range(request)
    except ChartRangeError as e:
        return HttpResponse(str(e), status=400, content_type="text/plain; charset=utf-8")
    return render(request, "console/partials/deployment_charts.html",
                  {"model": model, **chart_context(model.name, ep, picked)})


@require_GET
@requires("viewer")
def deployment_live(request: HttpRequest, name: str) -> HttpResponse:
    """Traffic split, replica convergence, the analysis plan and decisions: polled every 2 s."""
    model = found(selectors.model_get, name)
    ep, tick = watched_endpoint(model)
    context = live_context(request, model, ep, tick)
    seen = context["page_revision"]
    if seen is not None and seen != str(context["endpoint_revision"]):
        # Changed since the page drew its buttons (another user, the canary analysis, the
        # CLI): redraw the controls in place (out of band) instead of asking for a reload.
        context.update(controls_context(request, model, ep), controls_refreshed=True,
                       last_change=AuditEvent.objects.filter(
                           model_name=model.name, action__startswith="endpoint.")
                       .exclude(action__endswith=".refused").first())
    return render(request, "console/partials/deployment_live.html", context)


@require_POST
@requires(write="engineer")
def deployment_action(request: HttpRequest, name: str, op: str) -> HttpResponse:
    """Every rollout button posts here; the registry service decides and audits."""
    action = ACTIONS.get(op)
    if action is None:
        raise Http404(f"no rollout action {op!r}")
    form = action.form(request.POST)
    if form.is_valid():
        run_service(request, action.service, model_name=name,
                    success=action.success.format(**form.cleaned_data),
                    **form.service_kwargs())
    else:
        messages.error(request, error_text(form))
    return redirect(_page_url(name))
