"""A pipeline version drawn as boxes and arrows (server-rendered SVG): its inputs on the left,
its steps in columns by the order they can run, its outputs on the right. Pure geometry from
the stored spec; the template only places what this computes."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.urls import reverse

from serving.pipeline_graph import PipelineGraph

COLUMN = 230  # horizontal distance between columns
BOX_W, BOX_H = 170, 54
GAP = 26  # vertical gap between boxes of one column
MARGIN = 14


@dataclass
class Box:
    kind: str  # input | step | output
    title: str
    subtitle: str
    x: float
    y: float
    href: str = ""
    w: float = BOX_W
    h: float = BOX_H

    @property
    def cx(self) -> float:
        return self.x + self.w / 2


@dataclass
class Arrow:
    path: str
    label: str
    lx: float
    ly: float


@dataclass
class Drawing:
    width: float
    height: float
    boxes: list[Box] = field(default_factory=list)
    arrows: list[Arrow] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)  # for the table under the drawing
    edges: list[dict] = field(default_factory=list)


def _tensor_note(tensor: dict | None) -> str:
    if not tensor:
        return ""
    shape = tensor.get("shape")
    dims = "×".join("N" if d == -1 else str(d) for d in shape) if shape else "?"
    return f"{tensor['datatype']} [{dims}]"


def draw(spec: dict, signature: dict) -> Drawing:
    """The drawing of one pipeline version's spec (steps pinned to versions)."""
    graph = PipelineGraph.from_json(spec)
    levels = graph.levels()
    inputs = {t["name"]: t for t in signature.get("inputs", [])}
    outputs = {t["name"]: t for t in signature.get("outputs", [])}
    pinned = {s["name"]: s for s in spec["steps"]}
    columns: list[list[tuple[tuple[str, str], Box]]] = []
    columns.append([(("in", n), Box("input", n, _tensor_note(t), 0, 0))
                    for n, t in inputs.items()])
    for level in levels:
        col = []
        for step in level:
            alias = pinned[step.name].get("alias")
            sub = f"{step.model} v{step.version}" + (f" (@{alias})" if alias else "")
            href = reverse("console:version-detail", args=[step.model, int(step.version)])
            col.append((("step", step.name), Box("step", step.name, sub, 0, 0, href)))
        columns.append(col)
    columns.append([(("out", n), Box("output", n, _tensor_note(t), 0, 0))
                    for n, t in outputs.items()])
    tallest = max(len(c) for c in columns)
    height = tallest * BOX_H + (tallest - 1) * GAP + 2 * MARGIN
    boxes: dict[tuple[str, str], Box] = {}
    for i, col in enumerate(columns):
        used = len(col) * BOX_H + (len(col) - 1) * GAP
        top = (height - used) / 2
        for j, (key, box) in enumerate(col):
            box.x, box.y = MARGIN + i * COLUMN, top + j * (BOX_H + GAP)
            boxes[key] = box
    drawing = Drawing(width=2 * MARGIN + (len(columns) - 1) * COLUMN + BOX_W, height=height,
                      boxes=list(boxes.values()))

    def node(end: tuple[str, str], role: str) -> tuple[str, str]:
        if end[0]:
            return ("step", end[0])
        return ("in", end[1]) if role == "source" else ("out", end[1])

    wires: dict[tuple, list[str]] = {}
    for e in graph.edges:
        src, dst = node(e.source, "source"), node(e.target, "target")
        label = (e.source[1] if e.source[0] else "") + (
            f" → {e.target[1]}" if e.target[0] else "")
        wires.setdefault((src, dst), []).append(label.strip(" →") or e.target[1])
        drawing.edges.append({"from": (f"{e.source[0]}.{e.source[1]}" if e.source[0]
                                       else e.source[1]),
                              "to": f"{e.target[0]}.{e.target[1]}" if e.target[0]
                              else e.target[1]})
    for (src, dst), labels in wires.items():
        a, b = boxes[src], boxes[dst]
        x1, y1, x2, y2 = a.x + a.w, a.y + a.h / 2, b.x - 6, b.y + b.h / 2
        bend = max(40.0, (x2 - x1) / 2)
        path = f"M{x1:.0f},{y1:.0f} C{x1 + bend:.0f},{y1:.0f} {x2 - bend:.0f},{y2:.0f} " \
               f"{x2:.0f},{y2:.0f}"
        drawing.arrows.append(Arrow(path, ", ".join(labels), (x1 + x2) / 2,
                                    (y1 + y2) / 2 - 5))
    drawing.steps = [{"name": s.name, "model": s.model, "version": int(s.version),
                      "alias": pinned[s.name].get("alias"),
                      "href": reverse("console:version-detail", args=[s.model, int(s.version)]),
                      "feeds": [f"{name} ← {src[0] + '.' if src[0] else ''}{src[1]}"
                                for name, src in graph.feeds_of(s.name)]}
                     for s in graph.steps]
    return drawing
