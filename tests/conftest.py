"""Test harness for both modes. Embedded (default): SQLite + in-process worker. Clustered
(DATABASE_URL=postgres..., REDIS_URL=redis...): a real Celery worker is started on the test
database and stopped at the end."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CLUSTERED = bool(os.environ.get("REDIS_URL"))
# The specs that start `mmc-serve` describe one replica process (its replica id, its drain, a
# kill -9 of it); `--workers auto` would make each a supervisor of several here. The specs of
# several workers (tests/serving/test_workers.py) ask for them by name.
os.environ.setdefault("MMC_SERVE_WORKERS", "1")


def pytest_collection_modifyitems(config, items):
    """Browser tests last: Playwright's sync API leaves an event loop on the main thread, which
    would break later tests that call asyncio.run()."""
    items.sort(key=lambda item: item.get_closest_marker("browser") is not None)


def child_database_url() -> str:
    """The URL of the database pytest-django created, for child processes."""
    from django.db import connection

    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    auth = s["USER"] or "postgres"
    if s.get("PASSWORD"):
        auth += f":{s['PASSWORD']}"
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def child_env(**extra) -> dict:
    env = {**os.environ, "DATABASE_URL": child_database_url(), "PYTHONUNBUFFERED": "1",
           "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(REPO)}
    env.update({k: str(v) for k, v in extra.items()})
    return env


@pytest.fixture(scope="session", autouse=True)
def celery_worker(django_db_setup, django_db_blocker):
    """Clustered mode only: one real Celery worker process against the test database."""
    if not CLUSTERED:
        yield None
        return
    import redis

    redis.Redis.from_url(os.environ["REDIS_URL"]).flushdb()
    log = open(Path(os.environ["MMC_DATA_DIR"]) / "celery.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "console", "worker", "--pool=threads",
         "--concurrency=2", "--loglevel=INFO", "--without-gossip", "--without-mingle"],
        cwd=REPO, env=child_env(), stdout=log, stderr=subprocess.STDOUT,
    )
    deadline = time.time() + 60
    while time.time() < deadline:
        if b"ready." in Path(log.name).read_bytes():
            break
        if proc.poll() is not None:
            raise RuntimeError("celery worker exited: " + Path(log.name).read_text()[-2000:])
        time.sleep(0.2)
    else:
        proc.kill()
        raise RuntimeError("celery worker did not start: " + Path(log.name).read_text()[-2000:])
    yield proc
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def background_busy() -> bool:
    """Whether a task is queued or running that could still change a version: on the
    in-process pool (embedded), or in the broker's queue or on the Celery worker (clustered).
    A worker that does not answer counts as busy."""
    from registry.background import _pending

    if not CLUSTERED:
        return bool(_pending)
    from console.celery import app

    with app.connection_for_read() as conn:
        queue = app.conf.task_default_queue
        if conn.default_channel.queue_declare(queue).message_count:
            return True
    inspect = app.control.inspect(timeout=1.0, limit=1)  # one worker: done at its reply
    return any(not reply or any(reply.values())
               for reply in (inspect.active(), inspect.reserved(), inspect.scheduled()))


def wait_background_idle(timeout: float = 30.0) -> None:
    """Let queued validations finish, in-process or on the Celery worker. A version a spec left
    uploaded or validating with no task at work on it (a fabricated live lease, a message that
    never arrived) is not waited for: nothing would move it before the timeout."""
    from registry.background import wait_in_process
    from registry.models import ModelVersion, VersionStatus

    wait_in_process(timeout)
    deadline = time.time() + timeout
    busy = [VersionStatus.UPLOADED, VersionStatus.VALIDATING]
    idle_since = None  # idle twice, 0.2 s apart: a message in hand between queue and worker
    while time.time() < deadline and ModelVersion.objects.filter(status__in=busy).exists():
        if background_busy():
            idle_since = None
        elif idle_since is None:
            idle_since = time.time()
        elif time.time() - idle_since >= 0.2:
            return
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def background_work_settles(request):
    """Before a transactional test's database is flushed, wait for the background work it
    started: TRUNCATE against a worker holding row locks deadlocks on PostgreSQL."""
    marker = request.node.get_closest_marker("django_db")
    transactional = (marker is not None and marker.kwargs.get("transaction")) or any(
        f in request.fixturenames for f in ("transactional_db", "live_server"))
    if not transactional:
        yield
        return
    request.getfixturevalue("transactional_db")  # so our teardown runs before its flush
    yield
    wait_background_idle()


@pytest.fixture
def analysis_ticking(request):
    """The canary analysis' periodic tick runs, as in a running product: its last pass is
    recorded now, so a canary with a plan may start (registry.ticks). The specs of a silent
    analysis make that record old instead."""
    transactional = any(f in request.fixturenames for f in ("transactional_db", "live_server"))
    marker = request.node.get_closest_marker("django_db")
    transactional = transactional or (marker is not None and marker.kwargs.get("transaction"))
    request.getfixturevalue("transactional_db" if transactional else "db")
    from registry.ticks import tick_recorded

    tick_recorded()


@pytest.fixture(autouse=True)
def throttles_reset():
    """Rate-limit counts (DRF throttles, in the process's local-memory cache) never carry from one
    test to the next. axes' failed logins live in the database, which each test gets fresh."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3-compatible server (moto's server mode) in its own process, one per run."""
    from tests.objectstore import CREDENTIALS, MotoServer

    saved = {k: os.environ.get(k) for k in CREDENTIALS}
    os.environ.update(CREDENTIALS)  # boto3's credential chain, here and in child processes
    server = MotoServer(tmp_path_factory.mktemp("moto"))
    yield server
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(params=["file", "s3"])
def backend(request, tmp_path, settings):
    """Each artifact-store backend in turn (a folder; a bucket of its own on the S3 server),
    selected in settings, so default_store() is that backend, with a fresh ARTIFACT_ROOT."""
    from tests.objectstore import Backend

    root = tmp_path / "artifacts"
    if request.param == "file":
        chosen = Backend("file", root)
    else:
        server = request.getfixturevalue("s3_server")
        chosen = Backend("s3", root, f"s3://{server.new_bucket()}/artifacts", server.url)
    return chosen.select(settings)


@pytest.fixture
def users(transactional_db):
    from django.contrib.auth.models import Group, User

    from registry.services import ensure_roles

    ensure_roles()
    made = {}
    for role in ("viewer", "engineer", "admin"):
        user = User.objects.create_user(username=role, password=f"{role}-password-1")
        user.groups.add(Group.objects.get(name=role))
        made[role] = user
    made["nobody"] = User.objects.create_user(username="nobody", password="nobody-password-1")
    return made


@pytest.fixture
def client_for(users):
    """client_for("engineer") -> an APIClient authenticated with a real API token."""
    from rest_framework.test import APIClient

    from registry.audit import Actor
    from registry.services import token_create

    def make(role: str | None):
        client = APIClient()
        if role is not None:
            _, raw = token_create(username=users[role].username, name=f"{role}-ci",
                                  actor=Actor.system("test"))
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        return client

    return make


@pytest.fixture
def engineer(client_for):
    return client_for("engineer")


@pytest.fixture
def admin(client_for):
    return client_for("admin")


def upload(client, model: str, data: bytes, filename: str = "model.onnx", metadata=None):
    from django.core.files.uploadedfile import SimpleUploadedFile

    payload = {"file": SimpleUploadedFile(filename, data)}
    if metadata is not None:
        import json

        payload["metadata"] = json.dumps(metadata)
    return client.post(f"/api/v1/models/{model}/versions/", payload, format="multipart")


def wait_validated(client, model: str, number: int, timeout: float = 60) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        body = client.get(f"/api/v1/models/{model}/versions/{number}/").json()
        if body["status"] not in ("uploaded", "validating"):
            return body
        time.sleep(0.05)
    raise AssertionError(f"{model}:{number} still {body['status']} after {timeout}s")


@pytest.fixture
def ready_model(engineer):
    """create_ready("name", onnx_bytes) -> the validated version's JSON."""

    def make(name: str, data: bytes, **create):
        if engineer.get(f"/api/v1/models/{name}/").status_code == 404:
            assert engineer.post("/api/v1/models/", {"name": name, **create},
                                 format="json").status_code == 201
        r = upload(engineer, name, data)
        assert r.status_code in (200, 201), r.content
        body = wait_validated(engineer, name, r.json()["number"])
        assert body["status"] == "ready", body
        return body

    return make


# Single sign-on: a real OpenID provider (tests/oidc_provider) in its own process, one per run.
SSO_CLIENT = {"client_id": "mmc-console", "secret": "console-client-secret-at-least-32-bytes"}
SSO_HS256_CLIENT = {"client_id": "mmc-console-hs256",
                    "secret": "hs256-client-secret-at-least-32-bytes-long"}
SSO_ROLE_MAP = {"ml-admins": "admin", "ml-eng": "engineer", "ml-read": "viewer"}
SSO_USERS = [{"username": "alice", "password": "alice-idp-pw-1", "groups": ["ml-eng"]},
             {"username": "dave", "password": "dave-idp-pw-1", "groups": ["ml-read"]}]


def reload_console_urls() -> None:
    """The console routes SSO only when it is on (decided at import): import its URLs again."""
    import importlib

    from django.urls import clear_url_caches

    import console.urls
    import console.urls_ui

    importlib.reload(console.urls_ui)
    importlib.reload(console.urls)
    clear_url_caches()


@pytest.fixture(scope="session")
def oidc_provider(live_server, tmp_path_factory):
    from tests.oidc_provider.server import OpenIdProvider

    callback = f"{live_server.url}/login/sso/callback/"
    op = OpenIdProvider(tmp_path_factory.mktemp("oidc-provider"))
    op.start({"clients": [{**SSO_CLIENT, "name": "Model console", "redirect_uri": callback},
                          {**SSO_HS256_CLIENT, "redirect_uri": callback,
                           "algorithm": "HS256"}],
              "users": SSO_USERS})
    yield op
    op.stop()


@pytest.fixture
def sso(settings, oidc_provider, transactional_db):
    """The console signed up with the test provider: single sign-on on, its URLs routed, the
    provider's users back in their usual groups."""
    from console.sso import provider
    from registry.services import ensure_roles

    oidc_provider.apply({"users": [{k: v for k, v in u.items() if k != "password"}
                                   for u in SSO_USERS]})
    settings.OIDC_ISSUER = oidc_provider.issuer
    settings.SSO_ENABLED = True
    settings.OIDC_RP_CLIENT_ID = SSO_CLIENT["client_id"]
    settings.OIDC_RP_CLIENT_SECRET = SSO_CLIENT["secret"]
    settings.OIDC_ROLE_MAP = SSO_ROLE_MAP
    settings.OIDC_LABEL = "Sign in with Test IdP"
    # The specs' browser and httpx talk plain http to live_server: a Secure cookie (the
    # clustered default) would never come back, and the flow's state with it.
    settings.SESSION_COOKIE_SECURE = settings.CSRF_COOKIE_SECURE = False
    settings.AUTHENTICATION_BACKENDS = [*settings.AUTHENTICATION_BACKENDS,
                                        "console.sso.backend.SsoBackend"]
    reload_console_urls()
    ensure_roles()
    yield oidc_provider
    settings.SSO_ENABLED = False
    reload_console_urls()
    provider.forget()
