"""The CI example of docs/guide/as-code.md, run as written against a live embedded console
(`manage.py start`) from a scratch git repository: the page's walk-through — commit an mmc.yaml,
plan (exit 2), apply with --source $(git rev-parse HEAD), plan (exit 0), change the weight in a
second commit, plan shows it, apply — each line with the exit status its comment names; the audit
event carries the commit and the file's sha256; then the GitHub Actions workflow's plan step (a
pull request) and apply step (the merge), taken from the page's YAML."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import mmc
from registry import samples
from tests.conftest import REPO
from tests.doc_pages import fenced_blocks
from tests.embedded import embedded_start

PAGE = REPO / "docs" / "guide" / "as-code.md"
WALKTHROUGH = "not run: tests/test_as_code_ci.py runs these lines"
EXIT = re.compile(r"#\s*exit (\d+)")


def _blocks(language: str) -> list:
    return [b for b in fenced_blocks(PAGE) if b.language == language]


def walkthrough() -> tuple[str, list[str]]:
    """The mmc.yaml the walk-through commits (the YAML block just above it) and its lines."""
    blocks = fenced_blocks(PAGE)
    at = next(i for i, b in enumerate(blocks) if b.language == "bash" and WALKTHROUGH in b.before)
    file = next(b for b in reversed(blocks[:at]) if b.language == "yaml")
    return "\n".join(file.body) + "\n", [line for line in blocks[at].body if line.strip()]


def workflow() -> dict:
    block = next(b for b in _blocks("yaml") if any("runs-on:" in line for line in b.body))
    return yaml.safe_load("\n".join(block.body))


def step(job: dict, name: str) -> str:
    return next(s["run"] for s in job["steps"] if s.get("name") == name)


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    """A live console with `fraud` versions 1 and 2 uploaded and ready, and an admin client."""
    if shutil.which("git") is None:
        pytest.skip("the walk-through needs git")
    where = tmp_path_factory.mktemp("console")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(where / "home"),
           "XDG_CONFIG_HOME": str(where / "home" / ".config"),
           **{k: os.environ[k] for k in ("LANG", "TZ", "TMPDIR") if k in os.environ}}
    with embedded_start(where, env) as server, mmc.Client(server.url, "none") as client:
        client.login("admin", server.password, client="as-code-ci")
        client.create_model("fraud")
        for seed in (1, 2):
            version = client.upload("fraud", samples.mlp(n_in=4, hidden=(8,), n_out=2,
                                                         seed=seed), filename="fraud.onnx")
            assert client.wait_validated("fraud", version.number, timeout=60).status == "ready"
        yield client


def shell(console: mmc.Client, repo: Path):
    """run(line) -> CompletedProcess of `line` in bash, in `repo`, with `mmc` on PATH and the
    console's URL and a token in the environment, as a CI job has them."""
    venv = Path(sys.executable).parent
    if not (venv / "mmc").exists():
        pytest.skip("no `mmc` beside this python: install the checkout first")
    token = console.create_token("as-code-ci", expires_in_days=1).token
    env = {"PATH": f"{venv}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
           "HOME": str(repo.parent), "MMC_URL": console.url, "MMC_TOKEN": token,
           "GIT_AUTHOR_NAME": "ci", "GIT_AUTHOR_EMAIL": "ci@example.com",
           "GIT_COMMITTER_NAME": "ci", "GIT_COMMITTER_EMAIL": "ci@example.com",
           "GIT_CONFIG_NOSYSTEM": "1", "XDG_CONFIG_HOME": str(repo.parent / ".config"),
           **{k: os.environ[k] for k in ("LANG", "TZ", "TMPDIR") if k in os.environ}}

    def run(line: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-o", "pipefail", "-c", line], cwd=repo, env=env,
                              capture_output=True, text=True, timeout=120)

    return run


def applies(console: mmc.Client) -> list[mmc.AuditEvent]:
    """The applies' audit events, newest first (the action filter is a prefix: not refusals)."""
    return [e for e in console.audit(action="config.apply", limit=50)
            if e.action == "config.apply"]


def test_the_walk_through_runs_as_written_and_the_audit_event_carries_the_commit(console,
                                                                                 tmp_path):
    file, lines = walkthrough()
    repo = tmp_path / "deployments"
    repo.mkdir()
    (repo / "mmc.yaml").write_text(file)
    run = shell(console, repo)
    outputs = []
    for line in lines:
        expected = int(EXIT.search(line)[1]) if EXIT.search(line) else 0
        done = run(line)
        assert done.returncode == expected, (
            f"{line}\nexit {done.returncode}, not {expected}\n{done.stdout}\n{done.stderr}")
        outputs.append(done.stdout)
    plans = [out for line, out in zip(lines, outputs, strict=True) if "mmc plan" in line]
    assert plans[0].startswith("+ endpoint fraud\n") and "weight: 10" in plans[0]
    assert plans[1] == "no changes: the registry already matches the file\n"
    assert "    weight: 10 -> 25\n" in plans[2]
    assert console.get_endpoint("fraud").candidate_weight == 25
    event, first = applies(console)[:2]
    head = run("git rev-parse HEAD").stdout.strip()
    assert event.after["source"] == head and event.target == head
    assert event.after["sha256"] == hashlib.sha256((repo / "mmc.yaml").read_bytes()).hexdigest()
    assert first.after["source"] == run("git rev-parse HEAD~1").stdout.strip() != head


def test_the_workflow_plans_a_pull_request_and_applies_the_merge(console, tmp_path):
    jobs = workflow()["jobs"]
    plan_step, apply_step = step(jobs["plan"], "plan"), step(jobs["apply"], "apply")
    repo = tmp_path / "deployments"
    repo.mkdir()
    run = shell(console, repo)
    document = {"models": {"fraud": {"endpoint": {"stable": 1, "candidate": 2, "weight": 50}}}}
    (repo / "mmc.yaml").write_text(yaml.safe_dump(document))
    assert run("git init -q && git add mmc.yaml && git commit -qm 'fraud: 50 %'").returncode == 0
    # the pull request: the plan step passes and shows the change ...
    done = run(plan_step)
    assert done.returncode == 0 and " endpoint fraud\n" in done.stdout, done.stderr
    assert console.get_endpoint("fraud").candidate_weight != 50  # a plan changes nothing
    # ... and a file the server refuses fails it
    bad = {"models": {"fraud": {"endpoint": {"stable": 1, "candidate": 2, "weight": 500}}}}
    (repo / "bad.yaml").write_text(yaml.safe_dump(bad))
    refused = run(plan_step.replace("mmc.yaml", "bad.yaml"))
    assert refused.returncode == 1
    assert "models.fraud.endpoint.weight: must be an integer from 0 to 100" in refused.stderr
    # the merge: the apply step applies it, and the audit event names the merged commit
    done = run(apply_step)
    assert done.returncode == 0, done.stderr
    assert console.get_endpoint("fraud").candidate_weight == 50
    assert applies(console)[0].after["source"] == run("git rev-parse HEAD").stdout.strip()
    assert run(plan_step).stdout == "no changes: the registry already matches the file\n"
