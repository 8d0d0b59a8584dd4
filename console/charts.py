"""Small charts drawn on the server as inline SVG: line charts (one polyline per version, axes,
ticks and a text legend) and the serving-config search's throughput-against-p99 scatter. No chart
library: the pages redraw them by polling an htmx partial."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from datetime import datetime

WIDTH, HEIGHT = 400, 170
LEFT, RIGHT, TOP, BOTTOM = 52, 40, 12, 26

# Each series differs by dash pattern and marker shape as well as colour (never colour alone).
STYLES = (
    {"colour": "#2457c5", "dash": "", "marker": "circle", "name": "solid line, circles"},
    {"colour": "#a3339c", "dash": "7 4", "marker": "square", "name": "dashed line, squares"},
    {"colour": "#b35c00", "dash": "2 3", "marker": "diamond", "name": "dotted line, diamonds"},
    {"colour": "#17723a", "dash": "10 3 2 3", "marker": "circle", "name": "dash-dot line"},
)

# (key in version_series points, title, unit, scale applied to the value)
METRICS = (
    ("rps", "Requests per second", "req/s", 1.0),
    ("error_rate", "Error rate", "%", 100.0),
    ("p50_ms", "Latency p50", "ms", 1.0),
    ("p95_ms", "Latency p95", "ms", 1.0),
    ("p99_ms", "Latency p99", "ms", 1.0),
)


@dataclass
class Series:
    label: str              # "v2 candidate"
    points: list[dict]      # registry.metrics.version_series rows
    style: dict = field(default_factory=dict)


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 x 10^k at or above value (axis tops read as round numbers)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * power * (1 + 1e-9):
            return step * power
    return 10 * power


def fmt(value: float | None) -> str:
    if value is None:
        return "—"
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}".rstrip("0").rstrip(".")
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _marker(shape: str, x: float, y: float) -> str:
    """SVG path data for a 6 px marker centred on (x, y)."""
    if shape == "square":
        return f"M{x - 3:.1f},{y - 3:.1f}h6v6h-6z"
    if shape == "diamond":
        return f"M{x:.1f},{y - 4:.1f}l4,4l-4,4l-4,-4z"
    return (f"M{x - 3:.1f},{y:.1f}a3,3 0 1,0 6,0a3,3 0 1,0 -6,0z")


# Tick spacing per range: about 3 to 7 labels whatever the range.
TICK_STEPS = (60, 300, 900, 3600, 3 * 3600, 6 * 3600, 86400)


def ago(seconds: int) -> str:
    """−5m, −2h, −1d: an x tick's label."""
    if seconds % 86400 == 0:
        return f"−{seconds // 86400}d"
    if seconds % 3600 == 0:
        return f"−{seconds // 3600}h"
    return f"−{seconds // 60}m"


def x_tick_times(seconds: int) -> list[int]:
    """Seconds before now of each tick, oldest first, ending at 0 (now)."""
    step = next((s for s in TICK_STEPS if seconds / s <= 6), TICK_STEPS[-1])
    return list(range(seconds // step * step, -1, -step))


@dataclass
class Event:
    """A rollout event drawn as a numbered vertical line (from the audit log)."""

    n: int
    t: float
    text: str               # "canary start: v3 at 20 %"
    when: datetime | None = None


def line_chart(key: str, title: str, unit: str, scale: float, series: list[Series], *,
               seconds: int = 300, now: float | None = None,
               events: list[Event] = (), end_label: str = "now") -> dict:
    """Geometry for one chart: what templates/console/partials/chart.html draws."""
    now = time.time() if now is None else now
    start = now - seconds
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    values = [(p[key] or 0) * scale for s in series for p in s.points if p.get(key) is not None]
    top = nice_ceiling(max(values, default=0))

    def x_of(t: float) -> float:
        return LEFT + plot_w * min(max((t - start) / seconds, 0.0), 1.0)

    def y_of(v: float) -> float:
        return TOP + plot_h * (1 - min(v / top, 1.0))

    lines = []
    for s in series:
        segments, current, markers, latest = [], [], [], None
        for p in s.points:
            raw = p.get(key)
            if raw is None or p["t"] < start - 1:  # no successful request: break the line
                if current:
                    segments.append(current)
                current = []
                continue
            value = raw * scale
            x, y = x_of(p["t"]), y_of(value)
            current.append(f"{x:.1f},{y:.1f}")
            markers.append(_marker(s.style["marker"], x, y))
            latest = (x, y, value)
        if current:
            segments.append(current)
        lines.append({
            "label": s.label, "short": s.label.split(" ")[0], "style": s.style,
            "legend_marker": _marker(s.style["marker"], 14, 5),
            "segments": [" ".join(seg) for seg in segments],
            # Markers on every point are noise once a line has many; keep the shape readable.
            "markers": " ".join(markers[-1:] if len(markers) > 12 else markers),
            "count": sum(len(seg) for seg in segments),
            "latest": fmt(latest[2]) if latest else "—",
            "end": {"x": latest[0] + 6, "y": latest[1] + 4} if latest else None,
        })

    y_ticks = [{"y": round(y_of(top * f), 1), "label": fmt(top * f)} for f in (0, 0.5, 1)]
    x_ticks = [{"x": round(x_of(now - back), 1), "label": ago(back) if back else end_label}
               for back in x_tick_times(seconds)]
    marks = [{"n": e.n, "x": round(x_of(e.t), 1), "text": e.text}
             for e in events if start <= e.t <= now]
    has_data = any(line["count"] for line in lines)
    summary = "; ".join(f"{line['label']}: {line['latest']} {unit}" for line in lines)
    return {
        "id": f"chart-{key.replace('_', '-')}", "key": key, "title": title, "unit": unit,
        "width": WIDTH, "height": HEIGHT, "left": LEFT, "right": WIDTH - RIGHT, "top": TOP,
        "bottom": HEIGHT - BOTTOM, "label_y": HEIGHT - 6, "lines": lines,
        "y_ticks": y_ticks, "x_ticks": x_ticks, "has_data": has_data, "events": marks,
        "summary": summary or "no versions serving",
        "mid_x": LEFT + plot_w / 2, "mid_y": TOP + plot_h / 2,
    }


def version_charts(series: list[Series], *, seconds: int = 300, now: float | None = None,
                   events: list[Event] = (), end_label: str = "now") -> list[dict]:
    """The deployment page's five charts, every version on each (candidate next to stable),
    the rollout events marked on each."""
    for i, s in enumerate(series):
        s.style = STYLES[i % len(STYLES)]
    return [line_chart(key, title, unit, scale, series, seconds=seconds, now=now, events=events,
                       end_label=end_label)
            for key, title, unit, scale in METRICS]


# The serving-config search's chart: throughput against p99, one marker per measured point.
SCATTER = {"width": 480, "height": 260, "left": 56, "right": 24, "top": 16, "bottom": 44}
FITS = {"colour": "#2457c5", "marker": "circle", "name": "filled circle"}
MISSES = {"colour": "#8a94a3", "marker": "square", "name": "hollow square"}


#: Where a point's label may go, tried in turn: (dx, dy of the baseline, text-anchor).
LABEL_SPOTS = ((7, -6, "start"), (-7, -6, "end"), (7, 13, "start"), (-7, 13, "end"))


def _place_labels(dots: list[dict]) -> None:
    """Put each label beside its point where it covers no other label and no other point
    (the first spot free, else the first spot): near points stay told apart."""
    placed: list[tuple[float, float, float, float]] = []

    def free(box: tuple[float, float, float, float], own: dict) -> bool:
        clear_of_points = all(not (box[0] - pad <= o["x"] <= box[2] + pad
                                   and box[1] - pad <= o["y"] <= box[3] + pad)
                              for o in dots if o is not own
                              for pad in [9 if o["best"] else 4])  # the best is ringed
        return clear_of_points and all(box[2] < b[0] or b[2] < box[0] or box[3] < b[1]
                                       or b[3] < box[1] for b in placed)

    for d in dots:
        width = 6.2 * len(d["label"])
        spots = []
        for dx, dy, anchor in LABEL_SPOTS:
            x0 = d["x"] + dx - (width if anchor == "end" else 0)
            spots.append(((x0, d["y"] + dy - 9, x0 + width, d["y"] + dy + 2), dx, dy, anchor))
        box, dx, dy, anchor = next((spot for spot in spots if free(spot[0], d)), spots[0])
        placed.append(box)
        d.update(label_x=round(d["x"] + dx, 1), label_y=round(d["y"] + dy, 1), anchor=anchor)


def scatter_chart(points: list[dict], *, budget: float | None = None, best: int | None = None,
                  chart_id: str = "config-search-chart") -> dict:
    """Geometry for templates/console/partials/scatter_chart.html: each measured point at (p99
    ms, req/s), numbered as in its table; those within the budget with no errors a filled
    circle, the others a hollow square (never colour alone); the budget a dashed line; the
    best ringed and named."""
    g = SCATTER
    plot_w = g["width"] - g["left"] - g["right"]
    plot_h = g["height"] - g["top"] - g["bottom"]
    measured = [(i, p) for i, p in enumerate(points) if not p.get("failure")
                and p.get("rps") is not None and p.get("p99_ms") is not None]
    slowest = max((p["p99_ms"] for _, p in measured), default=0)
    # the budget is drawn where it does not squeeze the points into a corner; beyond, it is named
    x_top = nice_ceiling(max(slowest, min(budget or 0, 2 * slowest) if slowest else budget or 0))
    y_top = nice_ceiling(max((p["rps"] for _, p in measured), default=0))

    def x_of(ms: float) -> float:
        return g["left"] + plot_w * min(ms / x_top, 1.0)

    def y_of(rps: float) -> float:
        return g["top"] + plot_h * (1 - min(rps / y_top, 1.0))

    dots = []
    for i, p in measured:
        fits = budget is not None and p["p99_ms"] <= budget and not p.get("errors")
        x, y = x_of(p["p99_ms"]), y_of(p["rps"])
        style = FITS if fits else MISSES
        dots.append({"n": i, "x": round(x, 1), "y": round(y, 1), "fits": fits, "best": i == best,
                     "marker": _marker(style["marker"], x, y), "colour": style["colour"],
                     "label": f"#{i}" + (" best" if i == best else ""),
                     "title": f"#{i}: {fmt(p['rps'])} req/s, p99 {fmt(p['p99_ms'])} ms"
                              + (f", errors {sum(p['errors'].values())}" if p.get("errors")
                                 else "")})
    _place_labels(dots)
    best_dot = next((d for d in dots if d["best"]), None)
    return {
        "id": chart_id, **g, "right_x": g["width"] - g["right"],
        "bottom_y": g["height"] - g["bottom"], "mid_x": g["left"] + plot_w / 2,
        "mid_y": g["top"] + plot_h / 2, "label_y": g["height"] - g["bottom"] + 16,
        "axis_y": g["height"] - 6, "dots": dots, "best": best_dot, "fits": FITS,
        "misses": MISSES,
        "x_ticks": [{"x": round(x_of(x_top * f), 1), "label": fmt(x_top * f)}
                    for f in (0, 0.25, 0.5, 0.75, 1)],
        "y_ticks": [{"y": round(y_of(y_top * f), 1), "label": fmt(y_top * f)}
                    for f in (0, 0.5, 1)],
        "budget": ({"x": round(x_of(budget), 1), "off": budget > x_top,
                    "label": f"p99 budget {fmt(budget)} ms" + (" →" if budget > x_top else "")}
                   if budget is not None else None),
        "summary": (f"{len(dots)} point{'s' if len(dots) != 1 else ''}; "
                    + (f"the best {best_dot['title']}" if best_dot
                       else "none is best (within the budget with no errors)")),
    }
