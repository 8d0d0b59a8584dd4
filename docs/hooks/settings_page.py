"""MkDocs hook: the operator guide's Settings page rendered from the catalog (docs/settings.yml)
at build time, one table per topic where the page has its marker line, so the page cannot drift
from the catalog; tests/test_docs.py keeps the catalog to the code."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from mkdocs.exceptions import PluginError

CATALOG = Path(__file__).resolve().parent.parent / "settings.yml"
PAGE = "operator/settings.md"
MARKER = "<!-- settings-catalog -->"
READERS = {"console": "console", "replica": "replica", "cli": "CLI", "internal": "internal",
           "library": "library"}
_CODE_SPAN = re.compile(r"(`[^`]*`)")
_UNITS = [(1024**3, "GiB"), (1024**2, "MiB"), (1024, "KiB")]
_SPANS = [(86400, "day"), (3600, "hour"), (60, "minute")]


def load_catalog(path: Path = CATALOG) -> list[dict]:
    """The catalog's groups, each {title, intro, settings: [{name, default | default_is,
    read_by, about}]}."""
    return yaml.safe_load(path.read_text())["groups"]


def on_config(config, **kwargs):
    config.watch.append(str(CATALOG))  # `mkdocs serve` rebuilds when the catalog changes
    return config


def on_page_markdown(markdown: str, page, **kwargs) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise PluginError(f"{PAGE} has no `{MARKER}` line: the settings tables go there")
    return markdown.replace(MARKER, render(load_catalog()))


def render(groups: list[dict]) -> str:
    names = {s["name"] for g in groups for s in g["settings"]}
    out = []
    for group in groups:
        out += [f"## {group['title']}", "", _link_names(group["intro"].strip(), names), "",
                '<div class="mmc-settings" markdown>', "",
                "| Setting | Default | Read by | What it does |", "|---|---|---|---|"]
        for s in group["settings"]:
            name = s["name"]
            cells = [f"[`{name}`](#{name}){{#{name}}}", _default(s, names),
                     ", ".join(READERS[r] for r in s["read_by"]),
                     _link_names(" ".join(s["about"].split()), names - {name})]
            out.append("| " + " | ".join(c.replace("|", r"\|") for c in cells) + " |")
        out += ["", "</div>", ""]
    return "\n".join(out)


def _default(setting: dict, names: set[str]) -> str:
    if "default_is" in setting:
        return _link_names(str(setting["default_is"]), names - {setting["name"]})
    value = setting.get("default")
    if value is None or value == "":
        return "*empty*"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 3600, not 3600.0: the environment takes either
    shown = f"`{value}`"
    if isinstance(value, int | float) and value:
        shown += _in_words(setting["name"], value)
    return shown


def _in_words(name: str, value: float) -> str:
    """A large byte count or span of seconds, also in the unit a reader thinks in."""
    if name.endswith("_BYTES"):
        for size, unit in _UNITS:
            if value >= size and value % size == 0:
                return f" ({value // size:g} {unit})"
    if name.endswith(("_SECONDS", "_TTL")) and value >= 60:
        for size, unit in _SPANS:
            if value >= size and value % size == 0:
                count = value // size
                return f" ({count:g} {unit}{'s' if count != 1 else ''})"
    return ""


def _link_names(text: str, names: set[str]) -> str:
    """Every catalogued name in the text links to its row: as a code span, or bare where it has
    an underscore (`DEBUG` is a setting, DEBUG a log level). A long name may wrap after an
    underscore, never inside a word."""
    def link(name: str) -> str:
        return f'<a href="#{name}"><code>{name.replace("_", "_<wbr>")}</code></a>'

    parts = []
    for part in _CODE_SPAN.split(text):
        if part.startswith("`"):
            parts.append(link(part[1:-1]) if part[1:-1] in names else part)
        else:
            parts.append(re.sub(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9]\b",
                                lambda m: link(m[0]) if m[0] in names else m[0], part))
    return "".join(parts)
