"""A newcomer's first session with `mmc`, as they would type it, against a live embedded console:
log in with a password (fed on stdin), upload, deploy, check who they are, log out. The token
lives in a private config file while logged in; after logout the server refuses it."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import httpx
import pytest

from registry import samples
from tests.conftest import REPO
from tests.replicas import replicas

pytestmark = pytest.mark.django_db(transaction=True)


def mmc(*args: str, home, stdin: str = "", timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMC_")}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / "xdg"))
    return subprocess.run([sys.executable, "-m", "registry.cli", *args], cwd=REPO, env=env,
                          input=stdin, capture_output=True, text=True, timeout=timeout)


def test_login_upload_deploy_whoami_logout(users, tmp_path):
    from registry.models import AuditEvent

    model = tmp_path / "model.onnx"
    model.write_bytes(samples.mlp(n_in=4, hidden=(8,), n_out=2, seed=1))
    with replicas(1, embedded=True, log_dir=tmp_path) as (console,):
        wrong = mmc("login", console.url, "-u", "engineer", home=tmp_path, stdin="guess\n")
        assert wrong.returncode == 1 and "did not match" in wrong.stderr
        assert not (tmp_path / "xdg" / "mmc").exists()

        login = mmc("login", console.url, "-u", "engineer", home=tmp_path,
                    stdin="engineer-password-1\n")
        assert login.returncode == 0, login.stderr
        config = tmp_path / "xdg" / "mmc" / "config.json"
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        assert stat.S_IMODE(config.parent.stat().st_mode) == 0o700
        saved = json.loads(config.read_text())
        assert saved["url"] == console.url and saved["name"].startswith("mmc-cli@")
        assert "engineer-password-1" not in config.read_text()

        assert mmc("create-model", "onboard", home=tmp_path).returncode == 0
        up = mmc("upload", "onboard", str(model), "--wait", "60", home=tmp_path)
        assert up.returncode == 0, up.stderr
        assert json.loads(up.stdout)["status"] == "ready"
        deploy = mmc("deploy", "onboard", "1", "--wait", "30", home=tmp_path)
        assert deploy.returncode == 0, deploy.stdout + deploy.stderr
        infer = httpx.post(f"{console.url}/v2/models/onboard/infer", json={"inputs": [
            {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.1, 0.2, 0.3, 0.4]}]})
        assert infer.status_code == 200, infer.text

        who = mmc("whoami", home=tmp_path)
        assert who.returncode == 0, who.stderr
        assert "user:  engineer" in who.stdout and "role:  engineer" in who.stdout
        assert f"url:   {console.url}" in who.stdout
        assert f"token: {saved['name']} (expires " in who.stdout

        out = mmc("logout", home=tmp_path)
        assert out.returncode == 0, out.stderr
        assert not config.exists()
        refused = httpx.get(f"{console.url}/api/v1/me/",
                            headers={"Authorization": f"Bearer {saved['token']}"})
        assert refused.status_code == 401
        again = mmc("whoami", home=tmp_path)
        assert again.returncode == 1 and "not logged in" in again.stderr

    actions = list(AuditEvent.objects.filter(target=saved["token_key"])
                   .values_list("action", "actor_name"))
    assert sorted(actions) == [("token.login", "engineer"), ("token.revoke", "engineer")]
