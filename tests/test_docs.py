"""The documentation keeps to the code: the settings catalog (docs/settings.yml, rendered into
the operator guide's Settings page) lists exactly the MMC_* variables the code reads, every other
variable it reads, and the defaults the code writes as literals; the nav holds every page; the
README's links land on pages and headings that exist. `make docs` (mkdocs build --strict) checks
the links inside the site."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import markdown
import yaml

from tests.conftest import REPO
from tests.doc_pages import DOCS, nav_pages

CATALOG = DOCS / "settings.yml"
SOURCES = ("console", "registry", "serving", "mmc")
MMC_NAME = re.compile(r"MMC_[A-Z0-9_]+")
ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
#: what the environment is called where the code reads it: django-environ's `env`, os.environ,
#: and the mappings the serving settings are read from (`e`, `environ`)
ENV_MAPPINGS = {"env", "e", "environ", "os.environ"}
READ_METHODS = {"str", "int", "float", "bool", "list", "dict", "db", "get"}
READERS = {"console", "replica", "cli", "internal", "library"}
NO_DEFAULT = object()


@dataclass(frozen=True)
class EnvRead:
    name: str
    where: str  # path:line
    default: object  # the value the code falls back to, NO_DEFAULT where none is a literal


def _python_files():
    for package in SOURCES:
        yield from sorted((REPO / package).rglob("*.py"))


def _catalog() -> dict[str, dict]:
    entries = [s for g in yaml.safe_load(CATALOG.read_text())["groups"] for s in g["settings"]]
    return {s["name"]: s for s in entries}


def _mmc_names() -> dict[str, list[str]]:
    """Every MMC_* name the code uses as a string of its own (an env read, a constant naming
    one, a variable set for a child process), with where: comments and prose do not count."""
    found: dict[str, list[str]] = {}
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and MMC_NAME.fullmatch(node.value)):
                found.setdefault(node.value, []).append(
                    f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def _env_reads() -> list[EnvRead]:
    """Every read of a variable named by a literal: env.int("X", default=...),
    os.environ.get("X", ...), e.get("X") or ..., os.environ["X"], edge_limits' get("X", kind,
    default)."""
    reads = []
    for path in _python_files():
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            name, fallback = _read_of(node)
            if name is None:
                continue
            parent = parents.get(node)
            if (fallback is None and isinstance(parent, ast.BoolOp)
                    and isinstance(parent.op, ast.Or) and parent.values[0] is node):
                fallback = parent.values[1]  # e.get("X") or default
            reads.append(EnvRead(name, f"{path.relative_to(REPO)}:{node.lineno}",
                                 _value(fallback, path, node, parents)))
    return reads


def _read_of(node: ast.AST) -> tuple[str | None, ast.AST | None]:
    """(the variable's name, the default's expression) when `node` reads the environment."""
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) in ENV_MAPPINGS:
        key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str) \
                and ENV_NAME.fullmatch(key.value):
            return key.value, None
        return None, None
    if not isinstance(node, ast.Call) or not node.args:
        return None, None
    first = node.args[0]
    if not (isinstance(first, ast.Constant) and isinstance(first.value, str)
            and ENV_NAME.fullmatch(first.value)):
        return None, None
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr in READ_METHODS \
            and ast.unparse(func.value) in ENV_MAPPINGS:
        keyword = next((k.value for k in node.keywords if k.arg == "default"), None)
        return first.value, keyword if keyword is not None else (
            node.args[1] if len(node.args) > 1 else None)
    if isinstance(func, ast.Attribute) and ast.unparse(func) == "os.getenv":
        return first.value, node.args[1] if len(node.args) > 1 else None
    if isinstance(func, ast.Name) and func.id == "get" and len(node.args) == 3:
        return first.value, node.args[2]  # serving.edge_limits: get(name, kind, default)
    return None, None


def _value(expr: ast.AST | None, path: Path, at: ast.AST, parents: dict) -> object:
    """The default's value where the code states it: a literal or arithmetic on literals, or in
    the data plane also a constant or a dataclass field's default (`cls.poll_seconds`). In
    console/settings.py a name is a value derived from the environment (CLUSTERED, DATA_DIR):
    not a literal."""
    if expr is None or any(isinstance(n, ast.Call | ast.JoinedStr) for n in ast.walk(expr)):
        return NO_DEFAULT
    names = [n for n in ast.walk(expr) if isinstance(n, ast.Name)]
    if not names:
        return eval(compile(ast.Expression(expr), str(path), "eval"), {"__builtins__": {}})
    if path == REPO / "console" / "settings.py":
        return NO_DEFAULT
    module = importlib.import_module(".".join(path.relative_to(REPO).with_suffix("").parts))
    scope = dict(vars(module))
    node = at
    while node in parents and not isinstance(node, ast.ClassDef):
        node = parents[node]
    if isinstance(node, ast.ClassDef):
        scope["cls"] = getattr(module, node.name)
    try:
        return eval(compile(ast.Expression(expr), str(path), "eval"), scope)
    except NameError:  # a function's argument or local: known only when it runs
        return NO_DEFAULT


def _same(code: object, catalog: object) -> bool:
    """A default as the code holds it against the catalog's (written as in the environment)."""
    if isinstance(code, list | tuple):
        code = ",".join(map(str, code))
    if isinstance(code, dict):
        code = ",".join(f"{k}={v}" for k, v in code.items())
    if isinstance(code, bool) or isinstance(catalog, bool):
        return code is catalog
    if isinstance(code, int | float) and isinstance(catalog, int | float):
        return float(code) == float(catalog)
    if code is None:
        return catalog is None
    return str(code) == ("" if catalog is None else str(catalog))


def test_the_settings_catalog_lists_exactly_the_mmc_settings_the_code_reads():
    in_code, listed = _mmc_names(), {n for n in _catalog() if n.startswith("MMC_")}
    missing = {n: in_code[n][0] for n in sorted(set(in_code) - listed)}
    stale = sorted(listed - set(in_code))
    assert not missing and not stale, (
        f"docs/settings.yml lacks settings the code reads: {missing or 'none'}; "
        f"lists settings no code reads any more: {stale or 'none'}")


def test_the_settings_catalog_lists_every_other_variable_the_code_reads():
    listed = _catalog()
    missing = {r.name: r.where for r in _env_reads()
               if r.name not in listed and not MMC_NAME.fullmatch(r.name)}
    assert not missing, f"docs/settings.yml lacks variables the code reads: {missing}"


def test_a_default_the_code_states_is_the_catalogs_default():
    catalog, wrong = _catalog(), []
    for read in _env_reads():
        entry = catalog.get(read.name)
        if entry is None or read.default is NO_DEFAULT or "default_is" in entry:
            continue
        if not _same(read.default, entry.get("default")):
            wrong.append(f"{read.name}: {read.where} falls back to {read.default!r}, "
                         f"docs/settings.yml says {entry.get('default')!r}")
    assert not wrong, "\n".join(wrong)


def test_every_catalog_entry_says_its_default_who_reads_it_and_what_it_does():
    groups = yaml.safe_load(CATALOG.read_text())["groups"]
    names = [s["name"] for g in groups for s in g["settings"]]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    for group in groups:
        assert group["title"] and group["intro"].strip(), group
        for s in group["settings"]:
            assert ("default" in s) != ("default_is" in s), f"{s['name']}: default or default_is"
            assert s["read_by"] and set(s["read_by"]) <= READERS, s["name"]
            assert s["about"].strip(), s["name"]
            internal = s["read_by"] == ["internal"]
            assert internal == (group["title"] == "Internal"), (
                f"{s['name']}: internal settings, and only they, go in the Internal group")


def _hook(name: str):
    spec = importlib.util.spec_from_file_location(name, DOCS / "hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_settings_page_renders_every_setting_with_an_anchor_of_its_own():
    hook = _hook("settings_page")
    page = (DOCS / hook.PAGE).read_text()
    assert page.count(hook.MARKER) == 1
    html = markdown.markdown(hook.render(hook.load_catalog()),
                             extensions=["tables", "attr_list", "md_in_html"])
    for name in _catalog():
        assert f'id="{name}"' in html, name
    assert 'href="#REDIS_URL"' in html  # a name in a description links to its row
    assert "level (DEBUG, INFO" in html  # a word that only looks like one does not


def test_the_nav_holds_every_page_and_every_page_exists():
    nav = nav_pages()
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert len(nav) == len(set(nav)), "a page is in the nav twice"
    assert not set(nav) - pages, f"in the nav, not in docs/: {sorted(set(nav) - pages)}"
    assert not pages - set(nav), f"in docs/, not in the nav: {sorted(pages - set(nav))}"


def _anchors(page: Path) -> set[str]:
    """The heading ids MkDocs gives a page (Python-Markdown's toc), and ids written in it."""
    md = markdown.Markdown(extensions=["toc", "attr_list", "tables", "md_in_html"])
    html = md.convert(page.read_text())
    return set(re.findall(r'\bid="([^"]+)"', html))


def test_every_relative_link_in_the_readme_lands_on_a_docs_page_and_heading():
    text = (REPO / "README.md").read_text()
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # links inside code are not links
    links = re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text)
    broken = []
    for link in links:
        if re.match(r"[a-z][a-z0-9+.-]*:", link) or link.startswith("#"):
            continue  # a URL, or a heading of the README itself (GitHub checks neither)
        target, _, anchor = link.partition("#")
        path = (REPO / target).resolve()
        if not path.is_relative_to(DOCS) or not path.exists():
            broken.append(f"{link}: not a file under docs/")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{link}: {target} has no heading #{anchor}")
    assert not broken, "README.md: " + "; ".join(broken)

