"""The README's and the docs' commands run as written: every ```bash block marked
`<!-- runnable -->` is run, line by line, as one shell session against a fresh `manage.py start`
(what `make start` runs) with its own data folder: the README first, then every page of the site
in nav order (mkdocs.yml), since the pages read as one continuing tutorial. A page's ```python
blocks marked runnable are one script, run by the checkout's venv python in that session (its
environment, MMC_URL and MMC_TOKEN included; its folder) where the page's first one stands.
Nothing in a line is rewritten but the port; the environment the docs promise (Getting started,
"The examples in these pages are tested") is what the lines get."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO
from tests.doc_pages import DOCS, README, Block, fenced_blocks, reading_order
from tests.embedded import embedded_start

DEFAULT_ADDRESS = re.compile(r"\b(?:localhost|127\.0\.0\.1):8000\b")
LANGUAGES = ("bash", "python")
PLACEHOLDER = re.compile(r"<[A-Za-z][\w -]*>")
#: runs a page's python script so that a traceback names the page and its line
PYTHON = ('import sys; exec(compile(open(sys.argv[1]).read(), sys.argv[2], "exec"), '
          '{"__name__": "__main__"})')


@dataclass(frozen=True)
class Step:
    where: str  # page:line
    language: str
    code: str  # a shell line, or a page's python script (blank lines keep the page's numbering)


def commands(body: tuple[str, ...]) -> list[tuple[int, str]]:
    """The block's commands with the body line each starts on: a line ending in a backslash
    continues on the next."""
    out, current, first = [], "", 0
    for i, line in enumerate(body):
        if not current:
            first = i
        current += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            if current.strip():
                out.append((first, current.strip()))
            current = ""
    return out


def python_script(blocks: list[Block]) -> str:
    """A page's runnable python blocks as one script, each body on its own lines of the page."""
    lines = [""] * (blocks[-1].line + len(blocks[-1].body))
    for block in blocks:
        lines[block.line:block.line + len(block.body)] = block.body
    return "\n".join(lines) + "\n"


def steps(pages: list[Path]) -> list[Step]:
    out = []
    for page in pages:
        blocks = [b for b in fenced_blocks(page) if b.language in LANGUAGES and b.runnable]
        python = [b for b in blocks if b.language == "python"]
        for block in blocks:
            if block.language == "bash":
                out += [Step(block.where(i), "bash", cmd) for i, cmd in commands(block.body)]
            elif block is python[0]:
                out.append(Step(block.where(), "python", python_script(python)))
    return out


def _all_pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


RUNNABLE = steps(reading_order())


def test_every_block_is_runnable_or_says_why_not():
    blocks = [b for page in _all_pages() for b in fenced_blocks(page) if b.language in LANGUAGES]
    assert sum(b.runnable for b in blocks if b.page == README) >= 1
    assert sum(b.runnable for b in blocks) >= 6
    silent = [b.where() for b in blocks if not b.runnable and "not run" not in b.before]
    assert not silent, f"runnable, or say why not on the line before: {', '.join(silent)}"


def test_nothing_runnable_has_a_placeholder():
    found = []
    for step in RUNNABLE:
        if step.language == "bash":
            cmd = step.code
            if "..." in cmd or "…" in cmd.split("#")[0] or "<" in cmd:
                found.append(f"{step.where}: {cmd}")
            continue
        for n, line in enumerate(step.code.splitlines(), 1):
            code = line.split("#")[0]
            if "..." in code or "…" in code or PLACEHOLDER.search(code):
                found.append(f"{step.where.rsplit(':', 1)[0]}:{n}: {line}")
    assert not found, "\n".join(found)


def _clean_path() -> str:
    """PATH without any virtualenv: `mmc` must be reachable the way the README says."""
    venvs = {str(REPO / ".venv" / "bin"), str(Path(sys.executable).parent)}
    if os.environ.get("VIRTUAL_ENV"):
        venvs.add(str(Path(os.environ["VIRTUAL_ENV"]) / "bin"))
    return os.pathsep.join(p for p in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
                           if p and p not in venvs) or "/usr/bin:/bin"


def _base_env(home: Path) -> dict:
    keep = ("LANG", "LC_ALL", "TZ", "TMPDIR")
    return {**{k: os.environ[k] for k in keep if k in os.environ},
            "PATH": _clean_path(), "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
            "CURL_HOME": str(home)}


def _venv() -> Path:
    """The checkout's .venv, else the virtualenv running this test (CI may build its own)."""
    if (REPO / ".venv" / "bin" / "mmc").exists():
        return REPO / ".venv"
    if sys.prefix != sys.base_prefix and (Path(sys.prefix) / "bin" / "mmc").exists():
        return Path(sys.prefix)
    pytest.skip("the README's lines call .venv/bin/...: no virtualenv with mmc installed")


@pytest.fixture
def console(tmp_path):
    """`manage.py start` on a free port with a data folder of its own (embedded: no
    DATABASE_URL, no REDIS_URL, the real settings); yields (url, admin password)."""
    for tool in ("bash", "curl"):
        if shutil.which(tool) is None:
            pytest.skip(f"the README's lines need {tool}")
    with embedded_start(tmp_path, _base_env(tmp_path / "server-home")) as server:
        yield server.url, server.password


@pytest.mark.timeout(900)
def test_the_readme_runs_as_written(console, tmp_path):
    url, password = console
    token = httpx.post(f"{url}/api/v1/tokens/login/", json={
        "username": "admin", "password": password, "client": "readme-test"}).json()["token"]
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (work / ".venv").symlink_to(_venv())  # a checkout that ran `make install`
    (home / ".curlrc").write_text("fail-with-body\nshow-error\n")
    state = tmp_path / "state.sh"  # the shell session: what one line exports, the next one has
    state.write_text(f"export MMC_URL={shlex.quote(url)} MMC_TOKEN={shlex.quote(token)}\n")
    env = _base_env(home)
    port = url.rsplit(":", 1)[1]
    for n, step in enumerate(RUNNABLE):
        code = DEFAULT_ADDRESS.sub(f"127.0.0.1:{port}", step.code)
        if step.language == "python":
            script = tmp_path / f"step-{n}.py"
            script.write_text(code)
            page = step.where.rsplit(":", 1)[0]
            code = f".venv/bin/python -c {shlex.quote(PYTHON)} {script} {shlex.quote(page)}"
        shell = (f"set -eo pipefail\nsource {shlex.quote(str(state))}\n{code}\n"
                 f"export -p > {shlex.quote(str(state))}.next\n")
        started = time.monotonic()
        r = subprocess.run(["bash", "-c", shell], cwd=work, env=env, input=password + "\n",
                           capture_output=True, text=True, timeout=180)
        shown = step.code if step.language == "bash" else "its python blocks"
        assert r.returncode == 0, (
            f"{step.where}: `{shown}` exited {r.returncode} after "
            f"{time.monotonic() - started:.1f}s\nstdout: {r.stdout[-2000:]}\n"
            f"stderr: {r.stderr[-2000:]}")
        Path(f"{state}.next").replace(state)

    # what the lines did, seen from outside
    assert (work / "fraud-triton.tar.gz").stat().st_size > 0
    assert b'"outputs"' in (work / "response.json").read_bytes()
    auth = {"Authorization": f"Bearer {token}"}
    endpoint = httpx.get(f"{url}/api/v1/models/fraud/endpoint/", headers=auth).json()
    assert endpoint["stable"] == 2, endpoint
    churn = httpx.get(f"{url}/api/v1/models/churn/versions/1/", headers=auth).json()
    assert churn["original_filename"] == "churn.onnx", churn
