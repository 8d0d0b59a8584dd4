"""The shape of the code, as docs/architecture.md describes it: no import cycles in `registry` or
`serving` (function-local imports count: hiding a cycle inside a function is still a cycle),
every `registry` module sits in one of its layers and imports only from its own layer or the
ones below, `serving`'s sub-packages likewise (core, then sources and process, then the gRPC and
HTTP transports, then the composition root), and the data plane imports neither Django nor the
registry (nor onnx) outside its composition root, `serving/cli.py`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("registry", "serving")

# registry's layers, lowest first: a module imports only from its own layer or the ones below.
LAYERS = [
    ("registry.errors", "registry.routing", "registry.logfilters"),
    ("registry.choices", "registry.models", "registry.evaluation"),
    ("registry.audit", "registry.roles", "registry.notify", "registry.background", "registry.store",
     "registry.signatures", "registry.equivalence", "registry.metrics", "registry.selectors",
     "registry.convergence", "registry.samples", "registry.filtersets", "registry.ticks",
     "registry.batching"),
    ("registry.validation", "registry.metrics_retention"),
    ("registry.integrations",),
    ("registry.jobs", "registry.monitoring"),
    ("registry.services",),
    ("registry.tasks", "registry.serving_source", "registry.replica_api", "registry.api",
     "registry.cli", "registry.admin", "registry.middleware", "registry.management",
     "registry.apps", "registry.migrations"),
]
SERVING_ROOT = "serving.cli"  # the one place the data plane may be wired to Django/the registry
# serving's sub-packages, lowest first (docs/architecture.md): the protocol core knows no
# transport and no process model; the transports sit on it; the HTTP app also starts the gRPC
# front; the composition root wires a source to them.
SERVING_LAYERS = [
    ("serving.core", "serving.edge_limits"),
    ("serving.sources", "serving.process"),
    ("serving.grpc",),
    ("serving.http",),
    ("serving.cli",),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """Every module `path` imports, anywhere in it (module level or inside functions)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: {m for m in imports_of(path, known) if m in known and m != name}
            for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def layer_of(module: str, layers: list = LAYERS) -> int | None:
    for i, prefixes in enumerate(layers):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return None


def test_the_import_graph_finds_a_cycle_when_there_is_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_has_no_import_cycle(package):
    edges = {m: {d for d in deps if d.split(".")[0] == package}
             for m, deps in graph().items() if m.split(".")[0] == package}
    assert cycles(edges) == []


def test_every_registry_module_has_a_layer():
    unplaced = [m for m in graph() if m.startswith("registry.") and layer_of(m) is None]
    assert unplaced == []


def test_registry_imports_only_point_down_its_layers():
    upward = [f"{m} (layer {layer_of(m)}) imports {d} (layer {layer_of(d)})"
              for m, deps in graph().items() if m.startswith("registry.")
              for d in deps if d.startswith("registry.")
              and None not in (layer_of(m), layer_of(d))  # unplaced: the test above says so
              and layer_of(d) > layer_of(m)]
    assert upward == []


def test_the_data_plane_imports_no_django_registry_or_onnx_outside_its_composition_root():
    mods = modules()
    offending = []
    for name, path in mods.items():
        if not name.startswith("serving") or name == SERVING_ROOT:
            continue
        for imported in imports_of(path, set(mods)):
            if imported.split(".")[0] in ("django", "registry", "console", "onnx"):
                offending.append(f"{name} imports {imported}")
    assert offending == []


def test_every_serving_module_sits_in_a_sub_package_layer():
    unplaced = [m for m in graph() if m.startswith("serving.")
                and layer_of(m, SERVING_LAYERS) is None]
    assert unplaced == []


def test_serving_imports_only_point_down_its_layers():
    def layer(m: str) -> int | None:
        return layer_of(m, SERVING_LAYERS)

    upward = [f"{m} (layer {layer(m)}) imports {d} (layer {layer(d)})"
              for m, deps in graph().items() if m.startswith("serving.")
              for d in deps if d.startswith("serving.")
              and None not in (layer(m), layer(d)) and layer(d) > layer(m)]
    assert upward == []


def test_the_protocol_core_returns_tensors_and_knows_no_transport():
    """Nothing in serving.core imports a transport, a process model or a source, and nothing
    there mentions HTTP answers' bytes: DataPlane.predict returns numpy outputs."""
    core = {m: deps for m, deps in graph().items() if m.startswith("serving.core")}
    assert core and all(d.startswith("serving.core") for deps in core.values()
                        for d in deps if d.startswith("serving."))
    dataplane = (REPO / "serving" / "core" / "dataplane.py").read_text()
    assert "encode_infer_response" not in dataplane and "async def infer(" not in dataplane


def test_the_python_client_imports_neither_django_nor_the_server():
    """`mmc` is what a CI job or a notebook installs: httpx and the standard library only."""
    offending = [f"{module_name(path)} imports {imported}"
                 for path in (REPO / "mmc").rglob("*.py")
                 for imported in imports_of(path, set())
                 if imported.split(".")[0] in ("django", "rest_framework", "registry", "serving",
                                               "console")]
    assert (REPO / "mmc" / "__init__.py").exists() and offending == []
