"""Installs: the base install runs the product without the extras of features that are off by
default ([grpc], [s3], [fast-json]); turning one of those on without its extra stops start-up
with a message that names the extra; and the lock files pin every requirement pyproject.toml
names, so the two cannot drift apart silently (docs/operator/installing.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import REPO
from tests.embedded import embedded_start

#: top-level modules of the off-by-default extras' packages
EXTRA_MODULES = ("grpc", "tritonclient", "grpc_health", "grpc_reflection", "hpack", "boto3",
                 "botocore", "simdjson")
LOCKS = {"dev": REPO / "requirements" / "lock.txt",
         "runtime": REPO / "requirements" / "runtime-lock.txt"}
#: what each lock is compiled from (Makefile `lock`); tensorrt is a GPU host's own install
LOCKED_EXTRAS = {"dev": ("grpc", "s3", "fast-json", "tracing", "json-logs", "dev"),
                 "runtime": ("grpc", "s3", "fast-json", "tracing", "json-logs")}

SITECUSTOMIZE = f'''"""As if only the base install were there: the extras' modules do not import."""
import sys

BLOCKED = {EXTRA_MODULES!r}


class ExtrasNotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, ExtrasNotInstalled())
'''


@pytest.fixture
def base_env(tmp_path: Path) -> dict:
    """The environment of a process that sees the base install only (every process it starts
    too: the hook is a sitecustomize on PYTHONPATH), embedded, in a data folder of its own."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "MMC_QUOTA_REDIS_URL", "ARTIFACT_STORE",
                        "MMC_GRPC_PORT", "MMC_GRPC_HOST", "DJANGO_SETTINGS_MODULE")}
    return {**env, "PYTHONPATH": os.pathsep.join([str(hook), str(REPO)]),
            "MMC_DATA_DIR": str(tmp_path / "data"), "PYTHONUNBUFFERED": "1"}


def run(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_the_hook_hides_the_extras(base_env):
    done = run(base_env, "-c", "import grpc")
    assert done.returncode == 1 and "No module named 'grpc'" in done.stderr


IMPORT_THE_PRODUCT = """
import logging, sys
import django
from django.core.management import call_command

logging.basicConfig(level=logging.WARNING)
django.setup()
import console.asgi, serving.cli, serving.http.app, serving.http.server, serving.http.protocol
from serving.http import json_numbers
from serving.http.codec import decode_infer_request

call_command("check")
body = (b'{"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", '
        b'"data": [[1, 2, 3], [4, 5, 6.5]]}]}')
x = decode_infer_request(body, fast_json_min_bytes=0).inputs[0].array
assert x.tolist() == [[1, 2, 3], [4, 5, 6.5]], x
print("fast path:", json_numbers.AVAILABLE)
print("imported:", sorted({m.partition(".")[0] for m in sys.modules} & set(sys.argv[1:])))
"""


def test_the_base_install_imports_the_product_and_passes_its_checks(base_env):
    """django.setup with the project's settings, the console's ASGI app with its embedded data
    plane, mmc-serve, the HTTP server and protocol, `check`; a JSON body parses without
    pysimdjson (the general parser), and start-up said so once, naming the extra."""
    done = run({**base_env, "DJANGO_SETTINGS_MODULE": "console.settings"}, "-c",
               IMPORT_THE_PRODUCT, *EXTRA_MODULES)
    assert done.returncode == 0, done.stderr
    assert "System check identified no issues" in done.stdout
    assert "fast path: False" in done.stdout and "imported: []" in done.stdout
    fallback = [line for line in done.stderr.splitlines() if "mmc[fast-json]" in line]
    assert len(fallback) == 1, done.stderr
    assert "pysimdjson is not installed: large JSON bodies are read by the general parser" \
        in fallback[0]


def test_manage_py_start_serves_http_on_the_base_install(tmp_path, base_env):
    with embedded_start(tmp_path, base_env, "--no-demo") as server:
        assert httpx.get(f"{server.url}/v2/health/live", timeout=5).status_code == 200
        assert httpx.get(f"{server.url}/login/", timeout=5).status_code == 200
        assert httpx.get(f"{server.url}/v2/models/nothing-here", timeout=5).status_code == 404
    assert "mmc[fast-json]" in server.log.read_text()


def test_grpc_turned_on_without_its_extra_stops_start_with_the_extra_named(tmp_path, base_env):
    done = run(base_env, "manage.py", "start", "--no-demo", "--grpc-port", "9001")
    assert done.returncode == 1
    assert ("gRPC is on (--grpc-port 9001) but grpcio is not installed: "
            "pip install 'mmc[grpc]'") in done.stderr
    assert "Traceback" not in done.stderr

    (tmp_path / "models").mkdir()
    done = run({**base_env, "MMC_GRPC_PORT": "9001"}, "-m", "serving.cli",
               "--model-repository", str(tmp_path / "models"), "--workers", "1")
    assert done.returncode == 2
    assert done.stderr.strip() == ("mmc-serve: gRPC is on (MMC_GRPC_PORT=9001) but grpcio is "
                                   "not installed: pip install 'mmc[grpc]'")


def test_an_s3_store_without_its_extra_stops_start_with_the_extra_named(base_env):
    env = {**base_env, "ARTIFACT_STORE": "s3://models/mmc"}
    message = ("The S3 artifact store is on (ARTIFACT_STORE=s3://models/mmc) but boto3 is not "
               "installed: pip install 'mmc[s3]'")
    for command in (["check"], ["start", "--no-demo"]):
        done = run(env, "manage.py", *command)
        assert done.returncode == 1, done.stdout
        assert message in done.stderr and "mmc.store.E001" in done.stderr
        assert "Traceback" not in done.stderr


def test_an_s3_store_used_without_its_extra_raises_the_same_message(base_env):
    """Where no system check runs (a Celery worker), the first use says it."""
    done = run({**base_env, "DJANGO_SETTINGS_MODULE": "console.settings",
                "ARTIFACT_STORE": "s3://models/mmc"}, "-c",
               "import django; django.setup()\n"
               "from registry.store.artifacts import default_store\n"
               "try:\n    default_store()\nexcept Exception as exc:\n    print(repr(exc))\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "MissingExtra(\"The S3 artifact store is on (ARTIFACT_STORE=s3://models/mmc) but boto3 "
        "is not installed: pip install 'mmc[s3]'\")")


# -- the lock files ----------------------------------------------------------------------------

def pins(lock: Path) -> dict[str, str]:
    """name -> version of every `name==version` line, each with its hashes."""
    text = lock.read_text()
    found = {}
    for block in re.split(r"\n(?=\S)", text):
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", block)
        if match is None:
            continue
        assert "--hash=sha256:" in block, f"{lock.name}: {match[0]} has no hash"
        found[canonicalize_name(match[1])] = match[2]
    return found


def requirements(extras: tuple[str, ...]) -> list[Requirement]:
    """pyproject's base requirements and those of `extras`, following an extra that names the
    project's own extras (dev's mmc[grpc,s3,fast-json])."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    me = canonicalize_name(project["name"])
    found, todo, seen = [], [None, *extras], set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for line in project["optional-dependencies"][extra] if extra else project["dependencies"]:
            requirement = Requirement(line)
            if canonicalize_name(requirement.name) == me:
                todo.extend(requirement.extras)
            elif requirement.marker is None or requirement.marker.evaluate():
                found.append(requirement)
    return found


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_the_lock_pins_every_requirement_of_pyproject_within_its_bounds(lock):
    pinned = pins(LOCKS[lock])
    wrong = []
    for requirement in requirements(LOCKED_EXTRAS[lock]):
        version = pinned.get(canonicalize_name(requirement.name))
        if version is None:
            wrong.append(f"{requirement} is not in {LOCKS[lock].name}")
        elif not requirement.specifier.contains(version, prereleases=True):
            wrong.append(f"{requirement}: {LOCKS[lock].name} pins {version}")
    assert wrong == [], "pyproject.toml and the lock disagree: run `make lock`"


def test_the_runtime_lock_pins_what_the_dev_lock_pins():
    dev, runtime = pins(LOCKS["dev"]), pins(LOCKS["runtime"])
    assert {name: (version, dev.get(name)) for name, version in runtime.items()
            if dev.get(name) != version} == {}


def test_make_start_serves_on_the_port_and_host_given():
    done = subprocess.run(["make", "-n", "start", "PORT=8080", "HOST=0.0.0.0"], cwd=REPO,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "manage.py start --host 0.0.0.0 --port 8080" in done.stdout
