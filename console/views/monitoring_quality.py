"""The deployment page's model-quality card: each version's quality per window (from feedback
joined with captured answers) with its registered evaluation metric as a dashed reference line,
and the feedback counts. Loaded by htmx after the page; the range comes from the same picker
values as the metric charts (default 24 hours: quality windows are an hour wide by default)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from registry import selectors
from registry.models import ModelVersion
from registry.monitoring import feedback, quality

from .. import charts
from .access import requires
from .deployment import RANGES
from .models import found

TITLES = {"accuracy": ("Accuracy", "%", 100.0), "rmse": ("RMSE", "label units", 1.0)}
REFERENCE = {"colour": "#5b6472", "dash": "4 4", "marker": "diamond"}


def quality_context(model, picked) -> dict:
    now = time.time()
    since = datetime.fromtimestamp(now - picked.seconds, UTC)
    numbers = sorted(set(model.quality_points.filter(window_start__gte=since)
                         .values_list("version", flat=True)))
    by_metric: dict[str, list[charts.Series]] = {}
    for i, version in enumerate(ModelVersion.objects.filter(model=model, number__in=numbers)
                                .order_by("number")):
        metric = quality.primary_metric(quality.task_of(version))
        style = charts.STYLES[i % len(charts.STYLES)]
        points = quality.series(model, version.number, since=since)
        lines = by_metric.setdefault(metric, [])
        lines.append(charts.Series(label=f"v{version.number} {metric}", points=points,
                                   style=style))
        ref = quality.reference(version, metric)
        if ref is not None:
            flat = [{"t": now - picked.seconds, metric: ref}, {"t": now, metric: ref}]
            lines.append(charts.Series(label=f"v{version.number} registered {metric}",
                                       points=flat, style={**REFERENCE,
                                                           "colour": style["colour"]}))
    drawn = []
    for metric, series in by_metric.items():
        title, unit, scale = TITLES[metric]
        chart = charts.line_chart(metric, f"Model quality: {title}", unit, scale, series,
                                  seconds=picked.seconds, now=now)
        chart["id"] = f"quality-{metric}"
        for line in chart["lines"]:
            if " registered " in line["label"]:  # a flat reference: no markers, no end label
                line["markers"], line["end"] = "", None
        drawn.append(chart)
    return {"model": model, "quality_charts": drawn, "feedback": feedback.counts(model),
            "chart_range": picked, "ranges": RANGES.values()}


@require_GET
@requires("viewer")
def quality_card(request: HttpRequest, name: str) -> HttpResponse:
    model = found(selectors.model_get, name)
    picked = RANGES.get(request.GET.get("range", "24h"), RANGES["24h"])
    return render(request, "monitoring/quality_card.html", quality_context(model, picked))
