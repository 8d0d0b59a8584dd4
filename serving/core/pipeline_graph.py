"""A pipeline's graph: steps (pinned model versions) and edges that wire the pipeline's inputs,
the steps' outputs and the pipeline's outputs together. Pure data and checks, no I/O: the
registry validates a graph with it at creation; a replica runs one it was given.

Edges name tensors as `step.tensor` (a step's input or output) or as a bare `name` (the
pipeline's own input when it is a source, its own output when it is a target). Step names and
the pipeline's own tensor names carry no dot, so `pre.input.1` is step `pre`, tensor `input.1`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

STEP_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_STEPS = 32
MAX_EDGES = 512


class PipelineError(ValueError):
    """Why a pipeline graph cannot be accepted; `field` names the bad part of the spec."""

    def __init__(self, message: str, *, field: str = "pipeline") -> None:
        super().__init__(message)
        self.message = message
        self.field = field


@dataclass(frozen=True)
class Step:
    name: str
    model: str
    version: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.model, self.version)


@dataclass(frozen=True)
class Edge:
    """source/target as (step name, tensor); step name "" is the pipeline itself."""

    source: tuple[str, str]
    target: tuple[str, str]

    def __str__(self) -> str:
        return f"{_label(self.source)} → {_label(self.target)}"


def _label(end: tuple[str, str]) -> str:
    return f"{end[0]}.{end[1]}" if end[0] else end[1]


def parse_end(text: object, *, field: str) -> tuple[str, str]:
    """'step.tensor' → (step, tensor); 'name' → ("", name)."""
    if not isinstance(text, str) or not text or len(text) > 300:
        raise PipelineError(f"{field} must be 'step.tensor' or a pipeline tensor name",
                            field=field)
    step, dot, tensor = text.partition(".")
    if not dot:
        if not STEP_NAME.match(text):
            raise PipelineError(f"{field}: pipeline tensor name {text!r} must be 1-64 letters, "
                                "digits, '-' or '_'", field=field)
        return ("", text)
    if not step or not tensor:
        raise PipelineError(f"{field}: {text!r} must be 'step.tensor'", field=field)
    return (step, tensor)


@dataclass(frozen=True)
class PipelineGraph:
    """Steps in an order that runs every step after the steps it reads from, and the edges."""

    steps: tuple[Step, ...]
    edges: tuple[Edge, ...]

    def to_json(self) -> dict:
        """The resolved spec `from_json` reads back (steps pinned to versions)."""
        return {"steps": [{"name": s.name, "model": s.model, "version": s.version}
                          for s in self.steps],
                "edges": [{"from": _label(e.source), "to": _label(e.target)}
                          for e in self.edges]}

    @classmethod
    def from_json(cls, spec: dict) -> PipelineGraph:
        """The graph of a resolved spec (steps pinned to versions), ordered for running."""
        steps = [Step(str(s["name"]), str(s["model"]), str(s["version"])) for s in spec["steps"]]
        edges = [Edge(parse_end(e["from"], field="from"), parse_end(e["to"], field="to"))
                 for e in spec["edges"]]
        return cls(tuple(topological_order(steps, edges)), tuple(edges))

    @property
    def step_keys(self) -> set[tuple[str, str]]:
        return {s.key for s in self.steps}

    @cached_property
    def step_models(self) -> dict[str, tuple[str, ...]]:
        """Each model the steps run, with the names of its steps: whose keys and limits a
        call to the pipeline meets (serving.core.dataplane)."""
        names: dict[str, list[str]] = {}
        for step in self.steps:
            names.setdefault(step.model, []).append(step.name)
        return {model: tuple(steps) for model, steps in names.items()}

    def feeds_of(self, step: str) -> list[tuple[str, tuple[str, str]]]:
        """(input name, source) for every input of one step."""
        return [(e.target[1], e.source) for e in self.edges if e.target[0] == step]

    def outputs(self) -> list[tuple[str, tuple[str, str]]]:
        """(pipeline output name, source), in the spec's order."""
        return [(e.target[1], e.source) for e in self.edges if not e.target[0]]

    def levels(self) -> list[list[Step]]:
        """Steps grouped so that each group reads only from earlier groups: a group's steps
        can run at the same time."""
        level: dict[str, int] = {}
        for step in self.steps:
            sources = [src for _, src in self.feeds_of(step.name) if src[0]]
            level[step.name] = 1 + max((level[s[0]] for s in sources), default=-1)
        groups: list[list[Step]] = [[] for _ in range(1 + max(level.values(), default=-1))]
        for step in self.steps:
            groups[level[step.name]].append(step)
        return groups


def topological_order(steps: list[Step], edges: list[Edge]) -> list[Step]:
    """Steps ordered so each comes after those it reads from (Kahn's algorithm, stable in the
    spec's order); a cycle is a PipelineError that names it."""
    by_name = {s.name: s for s in steps}
    after: dict[str, set[str]] = {s.name: set() for s in steps}
    for e in edges:
        if e.source[0] and e.target[0] and e.source[0] in by_name and e.target[0] in by_name:
            after[e.target[0]].add(e.source[0])
    ordered: list[Step] = []
    done: set[str] = set()
    while len(ordered) < len(steps):
        ready = [s for s in steps if s.name not in done and after[s.name] <= done]
        if not ready:
            raise PipelineError("the steps form a cycle: " + _cycle(after, done), field="edges")
        for s in ready:
            ordered.append(s)
            done.add(s.name)
    return ordered


def _cycle(after: dict[str, set[str]], done: set[str]) -> str:
    """One cycle among the steps not yet ordered, as 'a → b → a'."""
    node = next(n for n in after if n not in done)
    path: list[str] = []
    while node not in path:
        path.append(node)
        node = sorted(after[node] - done)[0]
    loop = path[path.index(node):] + [node]
    return " → ".join(reversed(loop))


# -- validation against the steps' signatures ------------------------------------------------


def shapes_compatible(a: list | None, b: list | None) -> bool:
    """Same rank and every dimension equal, or dynamic (-1) on either side; unknown rank fits."""
    if a is None or b is None:
        return True
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b,
                                                                                 strict=True))


def _narrower(a: list | None, b: list | None) -> list | None:
    """The more specific of two compatible shapes (a fixed dimension wins over -1)."""
    if a is None:
        return b
    if b is None:
        return a
    return [x if x != -1 else y for x, y in zip(a, b, strict=True)]


def check_graph(steps: list[Step], edges: list[Edge], signatures: dict[str, dict]) -> dict:
    """Check a graph against its steps' signatures (step name → v2 signature) and derive the
    pipeline's own signature. Every step input is fed exactly once, every pipeline output
    exactly once, datatypes are equal and shapes compatible along every edge, no cycles."""
    if not steps:
        raise PipelineError("a pipeline needs at least one step", field="steps")
    if len(steps) > MAX_STEPS:
        raise PipelineError(f"a pipeline has at most {MAX_STEPS} steps", field="steps")
    if not edges:
        raise PipelineError("a pipeline needs edges (from its inputs to its outputs)",
                            field="edges")
    if len(edges) > MAX_EDGES:
        raise PipelineError(f"a pipeline has at most {MAX_EDGES} edges", field="edges")
    names = [s.name for s in steps]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise PipelineError(f"step name {dup!r} is used twice", field="steps")
    tensors = {s.name: ({t["name"]: t for t in signatures[s.name]["inputs"]},
                        {t["name"]: t for t in signatures[s.name]["outputs"]}) for s in steps}
    by_name = {s.name: s for s in steps}

    def describe(step: str) -> str:
        s = by_name[step]
        return f"step {step!r} ({s.model}:{s.version})"

    def tensor(end: tuple[str, str], role: str, edge: Edge) -> dict | None:
        step, name = end
        if not step:
            return None
        if step not in tensors:
            raise PipelineError(f"edge {edge}: unknown step {step!r} (steps: {', '.join(names)})",
                                field="edges")
        table = tensors[step][0 if role == "input" else 1]
        if name not in table:
            raise PipelineError(f"edge {edge}: {describe(step)} has no {role} {name!r} (its "
                                f"{role}s: {', '.join(table) or 'none'})", field="edges")
        return table[name]

    fed: dict[tuple[str, str], Edge] = {}
    pipeline_inputs: dict[str, dict] = {}
    pipeline_outputs: dict[str, dict] = {}
    for e in edges:
        if not e.source[0] and not e.target[0]:
            raise PipelineError(f"edge {e}: connects a pipeline input straight to a pipeline "
                                "output; route it through a step", field="edges")
        src = tensor(e.source, "output", e)
        dst = tensor(e.target, "input", e)
        if e.target in fed:
            raise PipelineError(f"{_label(e.target)} is fed twice: by {fed[e.target]} and by {e}",
                                field="edges")
        fed[e.target] = e
        if e.source[0] and e.source[0] == e.target[0]:
            raise PipelineError(f"edge {e}: a step cannot feed itself", field="edges")
        if src is None:  # a pipeline input: its datatype and shape come from what it feeds
            name = e.source[1]
            seen = pipeline_inputs.get(name)
            if seen is None:
                pipeline_inputs[name] = {"name": name, "datatype": dst["datatype"],
                                         "shape": dst["shape"]}
            else:
                _match(seen, dst, e, f"pipeline input {name!r}")
                seen["shape"] = _narrower(seen["shape"], dst["shape"])
        elif dst is None:  # a pipeline output
            pipeline_outputs[e.target[1]] = {"name": e.target[1], "datatype": src["datatype"],
                                             "shape": src["shape"]}
        else:
            _match(src, dst, e, f"{describe(e.source[0])} output {e.source[1]!r}")
    clash = set(pipeline_inputs) & set(pipeline_outputs)
    if clash:
        raise PipelineError(f"{sorted(clash)[0]!r} is both a pipeline input and a pipeline "
                            "output; give them different names", field="edges")
    for s in steps:
        for name in tensors[s.name][0]:
            if (s.name, name) not in fed:
                raise PipelineError(f"{describe(s.name)} input {name!r} is not fed by any edge",
                                    field="edges")
    if not pipeline_outputs:
        raise PipelineError("the pipeline has no output: add an edge from a step output to a "
                            "pipeline output name", field="edges")
    topological_order(steps, edges)
    return {"inputs": list(pipeline_inputs.values()), "outputs": list(pipeline_outputs.values())}


def _match(src: dict, dst: dict, edge: Edge, what: str) -> None:
    if src["datatype"] != dst["datatype"]:
        raise PipelineError(f"edge {edge}: datatype mismatch: {what} is {src['datatype']} but "
                            f"{_label(edge.target)} takes {dst['datatype']}", field="edges")
    if not shapes_compatible(src["shape"], dst["shape"]):
        raise PipelineError(f"edge {edge}: shape mismatch: {what} has shape {src['shape']} but "
                            f"{_label(edge.target)} takes {dst['shape']} (-1 = any size)",
                            field="edges")
