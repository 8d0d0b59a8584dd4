"""A load test works where the product runs: every replica advertises a URL a job can reach,
without an operator setting MMC_REPLICA_ADDRESS. The embedded server (`manage.py start`)
advertises where it listens; `mmc-serve` does too (compose: its container's host name); in
Kubernetes the pod IP from the downward API is completed with http:// and the serving port.
What a replica advertises is read the same way by the load test: a bare host:port or IP means
http://."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from unittest import mock

import httpx
import pytest
import yaml

import serving.cli
from serving.process.replica_address import advertised_url, replica_url
from tests import kube
from tests.embedded import embedded_start

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("address", "url"), [
    ("http://10.0.0.5:8001", "http://10.0.0.5:8001"),
    ("https://serving.example.com/", "https://serving.example.com"),
    ("http://serving", "http://serving"),          # a URL is taken as it is, port 80 included
    ("10.0.0.5:8001", "http://10.0.0.5:8001"),
    ("serving-7f9c:8001", "http://serving-7f9c:8001"),
    ("10.0.0.5", "http://10.0.0.5:8001"),          # a pod IP: the port it listens on
    ("fd00::5", "http://[fd00::5]:8001"),          # an IPv6 pod IP
    ("[fd00::5]:9000", "http://[fd00::5]:9000"),
    ("  10.0.0.5  ", "http://10.0.0.5:8001"),
    ("", ""), ("embedded", ""),                    # names no URL
    ("grpc://10.0.0.5:9001", ""), ("10.0.0.5:http", ""), ("http://", ""),
])
def test_an_address_is_read_as_a_url_with_http_and_the_port_filled_in(address, url):
    assert replica_url(address, port=8001) == url


def test_without_a_port_a_bare_host_is_http_on_80():
    assert replica_url("10.0.0.5") == "http://10.0.0.5"


def test_a_replica_advertises_where_it_listens_unless_told():
    assert advertised_url("", host="127.0.0.1", port=8000) == "http://127.0.0.1:8000"
    hostname = socket.gethostname()
    assert advertised_url("", host="0.0.0.0", port=8001) == f"http://{hostname}:8001"
    assert advertised_url("", host="::", port=8001) == f"http://{hostname}:8001"
    assert advertised_url("", host="0.0.0.0", port=8000,
                          wildcard_host="127.0.0.1") == "http://127.0.0.1:8000"
    assert advertised_url("http://lb.internal", host="0.0.0.0", port=8001) == \
        "http://lb.internal"


def mmc_serve_advertises(command: list[str], env: dict[str, str]) -> str:
    """What `mmc-serve` run as `command` with `env` puts in its heartbeats: its main() up to
    the server (not started), in this process, the environment restored after."""
    assert command[0] == "mmc-serve"
    with mock.patch.dict(os.environ, clear=False), \
            mock.patch.object(serving.cli, "serve"), \
            mock.patch.object(serving.cli, "app_from_env"):
        os.environ.pop("MMC_REPLICA_ADDRESS", None)
        os.environ.update({"MMC_REPLICA_TOKEN": "mmcr_spec", **env})
        serving.cli.main(command[1:])
        return os.environ["MMC_REPLICA_ADDRESS"]


def test_compose_serving_replicas_advertise_their_container_name_and_port():
    """compose sets no address: each replica names itself by its host name (its container's,
    which compose's DNS resolves for the worker that runs the load test) and its port."""
    service = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["serving"]
    assert "MMC_REPLICA_ADDRESS" not in (service.get("environment") or {})
    port = service["command"][service["command"].index("--port") + 1]
    assert port in service["expose"]
    assert mmc_serve_advertises(service["command"], {}) == \
        f"http://{socket.gethostname()}:{port}"


@pytest.mark.parametrize("folder", ["base", "overlays/example"])
def test_kubernetes_serving_pods_advertise_their_pod_ip_on_the_serving_port(folder):
    docs = {(d["kind"], d["metadata"]["name"]): d
            for d in kube.render(REPO / "deploy" / "kubernetes" / folder)}
    (c,) = docs["Deployment", "mmc-serving"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["MMC_REPLICA_ADDRESS"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    port = c["command"][c["command"].index("--port") + 1]
    assert {"name": "http", "containerPort": int(port)} in c["ports"]
    # the kubelet puts the bare pod IP there; the replica completes it
    assert mmc_serve_advertises(c["command"], {"MMC_REPLICA_ADDRESS": "10.42.0.17"}) == \
        f"http://10.42.0.17:{port}"
    assert mmc_serve_advertises(c["command"], {"MMC_REPLICA_ADDRESS": "fd00:42::17"}) == \
        f"http://[fd00:42::17]:{port}"


@pytest.mark.django_db
def test_a_load_test_reads_a_bare_address_as_http(settings):
    from django.utils import timezone

    from registry import services
    from registry.audit import Actor
    from registry.models import ModelVersion, RegisteredModel, ReplicaHeartbeat, VersionStatus
    from registry.services.loadtests import loadtest_create

    actor = Actor.system("test")
    services.model_create(name="m", actor=actor)
    ModelVersion.objects.create(model=RegisteredModel.objects.get(name="m"), number=1,
                                sha256="a" * 64, size_bytes=1, status=VersionStatus.READY,
                                signature={"inputs": [], "outputs": []})
    now = timezone.now()
    ReplicaHeartbeat.objects.create(replica="r1", address="10.0.0.5:8001", started_at=now,
                                    last_seen=now, versions={"m:1": {"state": "READY"}})
    job = loadtest_create(model_name="m", number=1, actor=actor, requests=1)
    assert job.params["url"] == "http://10.0.0.5:8001" and job.params["replica"] == "r1"


# -- embedded: a real `manage.py start` ----------------------------------------------------------


@pytest.fixture
def started(tmp_path):
    """`manage.py start` on a free port, as README says to run it (embedded, its own data
    folder, no MMC_REPLICA_ADDRESS); yields (url, admin password)."""
    keep = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR", "HOME")
    with embedded_start(tmp_path, {k: os.environ[k] for k in keep if k in os.environ}) as server:
        yield server.url, server.password


def test_a_load_test_runs_on_a_default_manage_py_start(started):
    url, password = started
    token = httpx.post(f"{url}/api/v1/tokens/login/", json={
        "username": "admin", "password": password, "client": "loadtest-spec"}).json()["token"]
    api = httpx.Client(base_url=f"{url}/api/v1/", timeout=30,
                       headers={"Authorization": f"Bearer {token}"})
    deadline = time.time() + 30
    while True:  # the embedded replica's first heartbeat
        replicas = api.get("replicas/").json()["replicas"]
        if replicas or time.time() > deadline:
            break
        time.sleep(0.2)
    assert [r["address"] for r in replicas] == [url]
    r = api.post("models/demo-mlp/versions/1/loadtest/",
                 json={"requests": 50, "concurrency": 2, "confirm": True})
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["params"]["url"] == url
    deadline = time.time() + 60
    while job["status"] in ("queued", "running") and time.time() < deadline:
        time.sleep(0.2)
        job = api.get(f"jobs/{job['id']}/").json()
    assert job["status"] == "succeeded", job
    assert job["summary"]["ok"] == 50 and job["summary"]["errors"] == {}
