"""The README's commands run as written: every ```bash block marked `<!-- runnable -->` is run,
line by line, in order, as one shell session against a fresh `manage.py start` (what `make start`
runs) with its own data folder. Nothing in a line is rewritten but the port; the environment the
README promises (its section "The examples in this file are tested") is what the lines get."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO
from tests.embedded import embedded_start

README = REPO / "README.md"
MARKER = "<!-- runnable -->"
DEFAULT_ADDRESS = re.compile(r"\b(?:localhost|127\.0\.0\.1):8000\b")


def bash_blocks(text: str) -> list[tuple[int, str, list[str]]]:
    """(line number, the line before the fence, the block's lines) of every ```bash block."""
    lines, blocks, i = text.splitlines(), [], 0
    while i < len(lines):
        if lines[i].strip() == "```bash":
            start, body = i, []
            i += 1
            while lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            before = next((ln for ln in reversed(lines[:start]) if ln.strip()), "")
            blocks.append((start + 1, before.strip(), body))
        i += 1
    return blocks


def commands(body: list[str]) -> list[str]:
    """The block's commands: a line ending in a backslash continues on the next."""
    out, current = [], ""
    for line in body:
        current += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            if current.strip():
                out.append(current.strip())
            current = ""
    return out


RUNNABLE = [(n, cmd) for n, before, body in bash_blocks(README.read_text())
            if before == MARKER for cmd in commands(body)]


def test_every_block_is_runnable_or_says_why_not():
    blocks = bash_blocks(README.read_text())
    assert sum(before == MARKER for _, before, _ in blocks) >= 6
    for n, before, _ in blocks:
        assert before == MARKER or "not run" in before, f"README.md:{n}: runnable, or say why not"


def test_nothing_runnable_has_a_placeholder():
    for n, cmd in RUNNABLE:
        assert "..." not in cmd and "…" not in cmd.split("#")[0] and "<" not in cmd, (n, cmd)


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
    for tool in ("bash", "curl"):
        if shutil.which(tool) is None:
            pytest.skip(f"the README's lines need {tool}")
    """`manage.py start` on a free port with a data folder of its own (embedded: no
    DATABASE_URL, no REDIS_URL, the real settings); yields (url, admin password)."""
    with embedded_start(tmp_path, _base_env(tmp_path / "server-home")) as server:
        yield server.url, server.password


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
    for n, cmd in RUNNABLE:
        line = DEFAULT_ADDRESS.sub(f"127.0.0.1:{port}", cmd)
        script = (f"set -eo pipefail\nsource {shlex.quote(str(state))}\n{line}\n"
                  f"export -p > {shlex.quote(str(state))}.next\n")
        started = time.monotonic()
        r = subprocess.run(["bash", "-c", script], cwd=work, env=env, input=password + "\n",
                           capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, (
            f"README.md block at line {n}: `{cmd}` exited {r.returncode} after "
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
