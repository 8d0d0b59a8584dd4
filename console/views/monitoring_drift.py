"""The version page's baseline section (a table of features with a small histogram each) and the
deployment page's drift card (PSI per feature over the picked range, with the threshold drawn,
the latest comparison and the episodes). Both loaded by htmx after their page."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from registry import selectors
from registry.models import Baseline, DriftEpisode
from registry.monitoring.drift import latest_points, points_between
from registry.services.drift import DEFAULTS, settings_of

from .. import charts
from .access import requires
from .deployment import RANGES
from .models import found

HIST_W, HIST_H = 120, 28
THRESHOLD = {"colour": "#c0392b", "dash": "4 4", "marker": "diamond"}
#: Features drawn per version: the ones with the highest latest PSI (the table lists all).
DRAWN = 4


def histogram(summary: dict) -> dict | None:
    """Bars of a numeric summary as a density (count / bin width): its bins are equal-mass
    deciles, so plain counts would all be the same height. The open outer bins end at the
    1st and 99th percentiles (drawn to the min and max, one far outlier would flatten every
    bar), so those two bars overstate their density a little."""
    if summary.get("kind") != "numeric" or not summary.get("count"):
        return None
    q = summary.get("quantiles") or {}
    low, high = q.get("0.01", summary["min"]), q.get("0.99", summary["max"])
    inner = [min(max(e, low), high) for e in summary["edges"][1:-1]]
    edges = [low, *inner, high]
    span = (high - low) or 1.0
    widths = [max(b - a, span * 1e-3) for a, b in zip(edges, edges[1:], strict=False)]
    density = [c / w for c, w in zip(summary["counts"], widths, strict=True)]
    top = max(density) or 1.0
    bars = []
    for a, w, d in zip(edges, widths, density, strict=False):
        h = HIST_H * d / top
        bars.append({"x": round((a - low) / span * HIST_W, 1),
                     "w": round(max(w / span * HIST_W - 0.5, 0.8), 1),
                     "y": round(HIST_H - h, 1), "h": round(h, 1)})
    return {"w": HIST_W, "h": HIST_H, "bars": bars}


def _rows(features: dict) -> list[dict]:
    rows = []
    for feature, s in features.items():
        row = {"feature": feature, **s, "hist": histogram(s),
               "median": (s.get("quantiles") or {}).get("0.5")}
        if s.get("kind") == "categorical":
            total = max(s["count"], 1)
            row["top_share"] = [(k, round(100 * v / total, 1)) for k, v in
                                list(s["top"].items())[:5]]
        rows.append(row)
    return rows


@require_GET
@requires("viewer")
def baseline_section(request: HttpRequest, name: str, number: int) -> HttpResponse:
    version = found(selectors.version_get, name, number)
    baseline = Baseline.objects.filter(version=version).first()
    parts = []
    if baseline is not None:
        parts = [(label, _rows(baseline.features.get(part, {})))
                 for part, label in (("inputs", "Inputs"), ("outputs", "Outputs"))
                 if baseline.features.get(part)]
    return render(request, "monitoring/baseline_section.html",
                  {"model": version.model, "version": version, "baseline": baseline,
                   "parts": parts})


def drift_context(model, picked) -> dict:
    now = time.time()
    since = datetime.fromtimestamp(now - picked.seconds, UTC)
    endpoint = selectors.endpoint_get(model)
    limits = settings_of(endpoint) if endpoint else dict(DEFAULTS)
    latest = latest_points(model)
    by_version: dict[int, dict[str, list[dict]]] = {}
    for p in points_between(model, since=since, until=datetime.fromtimestamp(now, UTC)):
        by_version.setdefault(p.version, {}).setdefault(p.feature, []).append(
            {"t": p.window_end.timestamp(), "psi": p.psi})
    drawn = []
    for version, features in sorted(by_version.items()):
        last = {p.feature: p.psi for p in latest if p.version == version}
        chosen = sorted(features, key=lambda f: -last.get(f, 0))[:DRAWN]
        series = [charts.Series(label=f, points=features[f], style=charts.STYLES[i])
                  for i, f in enumerate(sorted(chosen))]
        series.append(charts.Series(
            label="threshold", style=THRESHOLD,
            points=[{"t": now - picked.seconds, "psi": limits["psi_threshold"]},
                    {"t": now, "psi": limits["psi_threshold"]}]))
        chart = charts.line_chart("psi", f"v{version}: population stability index", "PSI",
                                  1.0, series, seconds=picked.seconds, now=now)
        chart["id"] = f"drift-v{version}"
        top = max(chosen, key=lambda f: last.get(f, 0)) if chosen else None
        for line in chart["lines"]:
            if line["label"] == "threshold":
                line["markers"] = ""
            if line["label"] != top:  # one end label: the others would overlap near zero
                line["end"] = None
        drawn.append(chart)
    return {"model": model, "drift_charts": drawn, "limits": limits,
            "latest": sorted(latest, key=lambda p: (p.version, -p.psi)),
            "episodes": DriftEpisode.objects.filter(model=model).order_by("-started_at")[:10],
            "chart_range": picked, "ranges": RANGES.values()}


@require_GET
@requires("viewer")
def drift_card(request: HttpRequest, name: str) -> HttpResponse:
    model = found(selectors.model_get, name)
    picked = RANGES.get(request.GET.get("range", "24h"), RANGES["24h"])
    return render(request, "monitoring/drift_card.html", drift_context(model, picked))
