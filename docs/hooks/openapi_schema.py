"""MkDocs hook: the API page's OpenAPI schema, written by drf-spectacular from the code at build
time (never committed) and added to the site as openapi.json, which the Swagger UI on docs/api.md
(mkdocs-swagger-ui-tag) reads. The schema is made as `manage.py spectacular` makes it for an
embedded install with an empty data folder of its own, so the environment of the build changes
nothing in it."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

SCHEMA = "openapi.json"
REPO = Path(__file__).resolve().parents[2]
SOURCES = ("console", "registry")  # a change here may change the schema
log = logging.getLogger("mkdocs.hooks.openapi_schema")
_made: dict[float, str] = {}  # newest source mtime -> schema, for `mkdocs serve`'s rebuilds


def on_files(files, config, **kwargs):
    files.append(File.generated(config, SCHEMA, content=schema()))
    return files


def schema() -> str:
    newest = max(p.stat().st_mtime for pkg in SOURCES for p in (REPO / pkg).rglob("*.py"))
    if newest not in _made:
        _made.clear()
        _made[newest] = _generate()
    return _made[newest]


def _generate() -> str:
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("MMC_", "DJANGO_", "ARTIFACT_", "AWS_"))
            and k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY")}
    with tempfile.TemporaryDirectory(prefix="mmc-docs-") as data:
        out = Path(data) / SCHEMA
        r = subprocess.run(
            [sys.executable, "manage.py", "spectacular", "--format", "openapi-json",
             "--validate", "--file", str(out)],
            cwd=REPO, capture_output=True, text=True, timeout=300,
            env={**keep, "DJANGO_SETTINGS_MODULE": "console.settings", "MMC_DATA_DIR": data})
        if r.returncode != 0:
            raise PluginError(f"manage.py spectacular exited {r.returncode}:\n{r.stderr[-3000:]}")
        for line in r.stderr.splitlines():  # drf-spectacular's own warnings, for the record
            if line.strip():
                log.info("spectacular: %s", line.strip())
        return out.read_text()
