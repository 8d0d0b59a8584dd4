"""The `mmc` command's manners: every example its --help shows is a command line it accepts, as
written; a reader that stops early (`mmc … | head`) gets no traceback; the exit codes are the
ones --help documents."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from registry.cli.main import __doc__ as HELP
from registry.cli.main import parser
from tests.cli_inprocess import inprocess_cli
from tests.conftest import REPO


def examples() -> list[str]:
    """The example lines of --help, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", HELP)
    return [line.strip() for line in text.splitlines() if line.strip().startswith("mmc ")]


def test_help_shows_its_examples_as_written():
    out = subprocess.run([sys.executable, "-m", "registry.cli", "--help"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    assert "--git-commit abc123 \\\n        --run-url" in out  # the continuation, as in a shell
    assert "Exit status: 0 done; 1 the server refused" in out


@pytest.mark.parametrize("line", examples())
def test_every_help_example_is_a_command_line_mmc_accepts(line):
    words = shlex.split(line, comments=True)
    assert words[0] == "mmc"
    parser().parse_args(words[1:])  # SystemExit (2) would fail the spec


@pytest.mark.django_db
def test_a_reader_that_stops_early_gets_no_traceback_and_exit_141(monkeypatch, capsys, users):
    """`mmc models | head -0`: stdout is a pipe whose reader has gone; print raises EPIPE."""
    from registry.audit import Actor
    from registry.services import access
    from registry.services.catalog import model_create

    for n in range(3):
        model_create(name=f"m{n}", actor=Actor.system("spec"))
    token = access.token_create(username=users["viewer"].username, name="cli",
                                actor=Actor.system("spec"))[1]
    read, write = os.pipe()
    os.close(read)  # the reader is gone
    broken = os.fdopen(write, "w")
    with inprocess_cli(token, monkeypatch, capsys) as run, monkeypatch.context() as patch:
        patch.setattr(sys, "stdout", broken)
        code, err = run("models")
    assert code == 141 and "Traceback" not in err, err
    broken.close()  # its fd now points at /dev/null: closing writes nothing and raises nothing


def test_a_bad_command_line_exits_2_and_an_unreachable_server_exits_1():
    bad = subprocess.run([sys.executable, "-m", "registry.cli", "deploy"], cwd=REPO,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "usage:" in bad.stderr
    down = subprocess.run([sys.executable, "-m", "registry.cli", "--url", "http://127.0.0.1:9",
                           "--token", "x", "models"], cwd=REPO, capture_output=True, text=True)
    assert down.returncode == 1 and down.stderr.startswith("mmc: cannot reach")
