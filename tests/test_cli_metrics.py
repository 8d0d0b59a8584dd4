"""`mmc upload --metric ... --run-url ... --git-commit ... --dataset ...` against the real API
(live server): the version carries them; `mmc versions --metric` filters; a malformed --metric
is refused before anything is sent."""

import json

import pytest

from registry import samples
from registry.audit import Actor
from registry.cli.main import main

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cli(live_server, users, engineer, monkeypatch, tmp_path):
    from registry.services import token_create

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    _, raw = token_create(username="engineer", name="cli", actor=Actor.system("test"))
    assert engineer.post("/api/v1/models/", {"name": "fraud"}, format="json").status_code == 201

    def run(*argv) -> int:
        return main(["--url", live_server.url, "--token", raw, *argv])

    return run


def test_upload_sends_metrics_and_lineage_and_versions_filters_by_metric(cli, engineer,
                                                                         tmp_path, capsys):
    first, second = tmp_path / "a.onnx", tmp_path / "b.onnx"
    first.write_bytes(samples.mlp(seed=1))
    second.write_bytes(samples.mlp(seed=2))
    assert cli("upload", "fraud", str(first), "--metric", "auc=0.91", "--metric", "acc=0.88",
               "--metric", "latency_ms=12", "--run-url", "https://mlflow.example/runs/7",
               "--git-commit", "abc1234", "--dataset", "tx-2026-10", "--wait", "60") == 0
    body = json.loads(capsys.readouterr().out)
    assert body["metrics"] == {"auc": 0.91, "acc": 0.88, "latency_ms": 12}
    assert body["lineage"] == {"run_url": "https://mlflow.example/runs/7",
                               "git_commit": "abc1234", "dataset": "tx-2026-10"}
    assert cli("upload", "fraud", str(second), "--metric", "auc=0.80") == 0
    capsys.readouterr()
    assert cli("versions", "fraud", "--metric", "auc>0.9") == 0
    header, *lines = capsys.readouterr().out.strip().splitlines()
    assert "METRICS" in header
    assert len(lines) == 1 and lines[0].split()[0] == "1" and "auc=0.91" in lines[0]


def test_a_malformed_metric_is_refused_before_sending(cli, engineer, tmp_path, capsys):
    path = tmp_path / "a.onnx"
    path.write_bytes(samples.mlp())
    assert cli("upload", "fraud", str(path), "--metric", "auc") == 1
    assert "expected NAME=NUMBER" in capsys.readouterr().err
    assert engineer.get("/api/v1/models/fraud/versions/").json()["count"] == 0


def test_the_server_s_refusal_is_shown(cli, tmp_path, capsys):
    path = tmp_path / "a.onnx"
    path.write_bytes(samples.mlp())
    assert cli("upload", "fraud", str(path), "--git-commit", "not-a-commit") == 1
    assert "is not a commit hash" in capsys.readouterr().err
    assert cli("versions", "fraud", "--metric", "auc>>1") == 1
    assert "auc>>1" in capsys.readouterr().err
