"""The documentation as the specs read it: the site's pages in nav order (mkdocs.yml) after the
README, and the fenced code blocks of a page with the line before each."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.conftest import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
MKDOCS = REPO / "mkdocs.yml"
RUNNABLE = "<!-- runnable -->"
_FENCE = re.compile(r"\s*```(\w+)")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # the opening fence's, from 1
    language: str
    before: str  # the nearest non-blank line above the fence, stripped
    body: tuple[str, ...]

    @property
    def runnable(self) -> bool:
        return self.before == RUNNABLE

    @property
    def name(self) -> str:
        return str(self.page.relative_to(REPO))

    def where(self, body_line: int | None = None) -> str:
        """page:line of the fence, or of the body's line `body_line` (from 0)."""
        return f"{self.name}:{self.line if body_line is None else self.line + 1 + body_line}"


def nav_pages() -> list[str]:
    """The site's pages, in the order its navigation lists them (paths under docs/)."""
    def walk(items):
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            yield from walk(value) if isinstance(value, list) else [value]

    return list(walk(yaml.safe_load(MKDOCS.read_text())["nav"]))


def reading_order() -> list[Path]:
    """The README, then every page of the site that exists, in nav order: one tutorial."""
    return [README] + [DOCS / p for p in nav_pages() if (DOCS / p).exists()]


def fenced_blocks(page: Path) -> list[Block]:
    lines, blocks, i = page.read_text().splitlines(), [], 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening:
            start, body, indent = i, [], len(lines[i]) - len(lines[i].lstrip())
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                line = lines[i]  # inside a list item: as indented as its fence
                body.append(line[indent:] if not line[:indent].strip() else line)
                i += 1
            before = next((ln for ln in reversed(lines[:start]) if ln.strip()), "")
            blocks.append(Block(page, start + 1, opening[1], before.strip(), tuple(body)))
        i += 1
    return blocks
