"""Runs the test OpenID provider in its own process on 127.0.0.1 (Django's runserver on a free
port), after generating its RS256 key and migrating its SQLite database in a temp folder."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def new_rsa_key_pem() -> bytes:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class OpenIdProvider:
    def __init__(self, folder: Path):
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.issuer = f"{self.url}/o"
        self.key_pem = new_rsa_key_pem()
        (folder / "signing-key.pem").write_bytes(self.key_pem)
        self.env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.oidc_provider.settings",
                    "OP_DIR": str(folder), "OP_ISSUER": self.issuer, "PYTHONPATH": str(REPO),
                    "PYTHONUNBUFFERED": "1"}
        for name in ("DATABASE_URL", "REDIS_URL"):  # the console's, not the provider's
            self.env.pop(name, None)
        self.process: subprocess.Popen | None = None

    def apply(self, spec: dict, *, migrate: bool = False) -> None:
        """Create or update clients and users (see cli.py)."""
        args = [sys.executable, "-m", "tests.oidc_provider.cli"]
        args += ["--migrate"] if migrate else []
        subprocess.run([*args, json.dumps(spec)], cwd=REPO, env=self.env, check=True,
                       capture_output=True, timeout=120)

    def set_groups(self, username: str, *groups: str) -> None:
        self.apply({"users": [{"username": username, "groups": list(groups)}]})

    def start(self, spec: dict) -> OpenIdProvider:
        self.apply(spec, migrate=True)
        self.log = open(self.folder / "server.log", "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "django", "runserver", f"127.0.0.1:{self.port}",
             "--noreload", "--skip-checks"],
            cwd=REPO, env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("the OpenID provider exited: " + self.log_tail())
            try:
                if httpx.get(f"{self.issuer}/.well-known/openid-configuration",
                             timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("the OpenID provider did not start: " + self.log_tail())

    def log_tail(self) -> str:
        return (self.folder / "server.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
