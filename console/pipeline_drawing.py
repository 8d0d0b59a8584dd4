"""A pipeline version drawn as boxes and arrows (server-rendered SVG): its inputs on the left,
its steps in columns by the order they can run, its outputs on the right. Pure geometry from
the stored spec; the template only places what this computes."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.urls import reverse

from serving.core.pipeline_graph import PipelineGraph

COLUMN = 230  # horizontal distance between columns
BOX_W, BOX_H = 170, 54
GAP = 26  # vertical gap between boxes of one column
MARGIN = 14
ARC = 36  # room above the boxes for wires that skip a column


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
    col_of = {key: i for i, col in enumerate(columns) for key, _ in col}

    def node(end: tuple[str, str], role: str) -> tuple[str, str]:
        if end[0]:
            return ("step", end[0])
        return ("in", end[1]) if role == "source" else ("out", end[1])

    wires: dict[tuple, list[str]] = {}
    table: list[dict] = []
    for e in graph.edges:
        src, dst = node(e.source, "source"), node(e.target, "target")
        # The tensor that flows, and the input it feeds when that is named otherwise (an
        # output's box names the output).
        label = e.source[1] if not e.target[0] or e.target[1] == e.source[1] else \
            f"{e.source[1]} → {e.target[1]}"
        wires.setdefault((src, dst), []).append(label)
        table.append({"from": f"{e.source[0]}.{e.source[1]}" if e.source[0] else e.source[1],
                      "to": f"{e.target[0]}.{e.target[1]}" if e.target[0] else e.target[1]})
    # A wire that skips a column arcs over the boxes between: room for it above them.
    skips = {w for w in wires if col_of[w[1]] - col_of[w[0]] > 1}
    top = MARGIN + (ARC if skips else 0)
    height = tallest * BOX_H + (tallest - 1) * GAP + top + MARGIN
    boxes: dict[tuple[str, str], Box] = {}
    for i, col in enumerate(columns):
        used = len(col) * BOX_H + (len(col) - 1) * GAP
        first = top + (height - top - MARGIN - used) / 2
        for j, (key, box) in enumerate(col):
            box.x, box.y = MARGIN + i * COLUMN, first + j * (BOX_H + GAP)
            boxes[key] = box
    drawing = Drawing(width=2 * MARGIN + (len(columns) - 1) * COLUMN + BOX_W, height=height,
                      boxes=list(boxes.values()), edges=table)

    def ports(ends: dict) -> dict[tuple, float]:
        """Where each wire leaves or enters its box: spread along the side, arcs on top."""
        placed: dict[tuple, float] = {}
        for key, group in ends.items():
            box = boxes[key]
            group.sort(key=lambda item: (item[0] not in skips, item[1]))
            for k, (wire, _) in enumerate(group):
                placed[wire] = box.y + box.h * (k + 1) / (len(group) + 1)
        return placed

    outgoing: dict[tuple, list] = {}
    incoming: dict[tuple, list] = {}
    for src, dst in wires:
        outgoing.setdefault(src, []).append(((src, dst), boxes[dst].y))
        incoming.setdefault(dst, []).append(((src, dst), boxes[src].y))
    leave, enter = ports(outgoing), ports(incoming)
    for (src, dst), labels in wires.items():
        a, b = boxes[src], boxes[dst]
        x1, y1, x2, y2 = a.x + a.w, leave[(src, dst)], b.x - 6, enter[(src, dst)]
        if (src, dst) in skips:
            between = [bx.y for k, bx in boxes.items() if col_of[src] < col_of[k] < col_of[dst]]
            peak = min(between) - ARC / 2  # the arc's highest point, over the boxes it passes
            c = (peak - (y1 + y2) / 8) / 0.75  # a cubic's midpoint: (y1 + 3c + 3c + y2) / 8
            bend = (x2 - x1) / 3
            path = (f"M{x1:.0f},{y1:.0f} C{x1 + bend:.0f},{c:.0f} {x2 - bend:.0f},{c:.0f} "
                    f"{x2:.0f},{y2:.0f}")
            lx, ly = (x1 + x2) / 2, peak - 4
        else:
            bend = max(40.0, (x2 - x1) / 2)
            path = (f"M{x1:.0f},{y1:.0f} C{x1 + bend:.0f},{y1:.0f} {x2 - bend:.0f},{y2:.0f} "
                    f"{x2:.0f},{y2:.0f}")
            lx, ly = (x1 + x2) / 2, (y1 + y2) / 2 - 5
        drawing.arrows.append(Arrow(path, ", ".join(labels), lx, ly))
    drawing.steps = [{"name": s.name, "model": s.model, "version": int(s.version),
                      "alias": pinned[s.name].get("alias"),
                      "href": reverse("console:version-detail", args=[s.model, int(s.version)]),
                      "feeds": [f"{name} ← {src[0] + '.' if src[0] else ''}{src[1]}"
                                for name, src in graph.feeds_of(s.name)]}
                     for s in graph.steps]
    return drawing
