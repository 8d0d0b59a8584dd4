"""Webhooks: lifecycle events POSTed as signed JSON to subscribed URLs, retried with backoff,
every attempt logged; subscriptions are admin-only and audited. A real HTTP receiver on
127.0.0.1 stands in for the subscriber and verifies each signature."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from registry import samples, services
from registry.audit import Actor
from registry.errors import LifecycleError
from registry.integrations.webhooks import event_for
from registry.models import AuditEvent, DeliveryStatus, WebhookDelivery
from tests.conftest import upload, wait_validated
from tests.test_rollouts import make_model

pytestmark = pytest.mark.django_db(transaction=True)
SECRET = "receiver-secret-0123456789"
ME = Actor.system("release-bot")


class Receiver:
    """A subscriber: answers `fail` times with 500, then 200; checks every signature."""

    def __init__(self, fail: int = 0, secret: str = SECRET):
        self.fail, self.secret, self.calls = fail, secret, []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                expected = "sha256=" + hmac.new(receiver.secret.encode(), body,
                                                hashlib.sha256).hexdigest()
                receiver.calls.append({
                    "at": time.monotonic(), "body": body, "json": json.loads(body),
                    "event": self.headers["X-MMC-Event"],
                    "verified": hmac.compare_digest(expected,
                                                    self.headers["X-MMC-Signature"] or "")})
                status = 500 if len(receiver.calls) <= receiver.fail else 200
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"nope" if status == 500 else b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self) -> list[tuple[str, str]]:
        return sorted((c["json"]["model"], c["event"]) for c in self.calls)


@pytest.fixture
def receivers():
    made = []

    def make(**kwargs) -> Receiver:
        made.append(Receiver(**kwargs))
        return made[-1]

    yield make
    for r in made:
        r.server.shutdown()
        r.server.server_close()


def wait_deliveries(n: int, *, timeout: float = 30, **filters) -> list[WebhookDelivery]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        done = list(WebhookDelivery.objects.filter(**filters).exclude(
            status=DeliveryStatus.PENDING).order_by("id"))
        if len(done) >= n:
            return done
        time.sleep(0.1)
    raise AssertionError(f"{len(done)}/{n} deliveries finished: "
                         f"{list(WebhookDelivery.objects.values('event', 'status', 'attempts'))}")


def hook(admin, url: str, **body) -> dict:
    r = admin.post("/api/v1/webhooks/", {"url": url, "secret": SECRET, **body}, format="json")
    assert r.status_code == 201, r.content
    return r.json()


def test_a_failing_receiver_gets_retries_with_backoff_and_every_attempt_is_logged(
        admin, engineer, receivers):
    receiver = receivers(fail=2)
    assert engineer.post("/api/v1/models/", {"name": "fraud"}, format="json").status_code == 201
    sub = hook(admin, receiver.url, model="fraud", events=["version.ready", "version.failed"])
    upload(engineer, "fraud", samples.mlp())
    assert wait_validated(engineer, "fraud", 1)["status"] == "ready"

    [delivery] = wait_deliveries(1)
    assert delivery.status == DeliveryStatus.SUCCEEDED
    log = admin.get(f"/api/v1/webhooks/{sub['id']}/deliveries/").json()["results"]
    assert len(log) == 1 and log[0]["event"] == "version.ready" and log[0]["attempts"] == 3
    attempts = log[0]["attempt_log"]
    assert [a["number"] for a in attempts] == [1, 2, 3]
    assert [a["status_code"] for a in attempts] == [500, 500, 200]
    assert attempts[0]["error"] == "HTTP 5xx" and attempts[2]["error"] == ""
    assert all(a["duration_ms"] > 0 for a in attempts)

    assert len(receiver.calls) == 3 and all(c["verified"] for c in receiver.calls)
    assert len({c["body"] for c in receiver.calls}) == 1  # the same signed bytes each time
    gaps = [b["at"] - a["at"] for a, b in zip(receiver.calls, receiver.calls[1:], strict=False)]
    assert gaps[0] >= 0.9 and gaps[1] >= 1.8, gaps  # exponential backoff: 1 s, then 2 s
    body = receiver.calls[0]["json"]
    assert body["event"] == "version.ready" and body["model"] == "fraud"
    assert body["version"] == 1 and body["actor"] == "validator"
    assert body["after"]["status"] == "ready" and body["time"]


def test_global_and_per_model_subscriptions_get_only_their_events(admin, receivers):
    everything, only_a, a_canary = receivers(), receivers(), receivers()
    make_model("a")
    make_model("b")
    hook(admin, everything.url)
    hook(admin, only_a.url, model="a")
    hook(admin, a_canary.url, model="a", events=["canary.started"])

    for name in ("a", "b"):
        services.endpoint_deploy(model_name=name, version_number=1, actor=ME)  # not an event
        services.canary_start(model_name=name, version_number=2, weight=10, actor=ME)
    services.canary_promote(model_name="a", actor=ME)
    services.canary_abort(model_name="b", actor=ME, reason="p99 too high")
    wait_deliveries(4 + 2 + 1)

    assert everything.events() == [("a", "canary.promoted"), ("a", "canary.started"),
                                   ("b", "canary.rolled_back"), ("b", "canary.started")]
    assert only_a.events() == [("a", "canary.promoted"), ("a", "canary.started")]
    assert a_canary.events() == [("a", "canary.started")]
    started = next(c["json"] for c in a_canary.calls)
    assert started["version"] == 2 and started["actor"] == "release-bot"
    assert started["before"]["candidate"] is None and started["after"]["candidate"] == 2
    rolled_back = next(c["json"] for c in everything.calls if c["event"] == "canary.rolled_back")
    assert rolled_back["reason"] == "p99 too high"
    assert all(c["verified"] for r in (everything, only_a, a_canary) for c in r.calls)


def test_blue_green_switch_and_rollback_are_events_and_a_refusal_is_not(admin, receivers):
    receiver = receivers()
    make_model("bg")
    hook(admin, receiver.url, events=["bluegreen.switched", "endpoint.rolled_back",
                                      "canary.started"])
    services.endpoint_deploy(model_name="bg", version_number=1, actor=ME)
    services.endpoint_deploy(model_name="bg", version_number=2, actor=ME)
    services.rollback(model_name="bg", version_number=1, actor=ME, order="unload-first")
    services.bluegreen_deploy(model_name="bg", version_number=3, actor=ME)
    services.bluegreen_switch(model_name="bg", actor=ME)
    with pytest.raises(LifecycleError):
        services.canary_start(model_name="bg", version_number=2, actor=ME)
    wait_deliveries(2)
    time.sleep(0.3)
    # Unload-first rollback is two transitions; subscribers hear of it once, when it is done.
    assert sorted(c["event"] for c in receiver.calls) == ["bluegreen.switched",
                                                          "endpoint.rolled_back"]
    by_event = {c["event"]: c["json"] for c in receiver.calls}
    assert by_event["endpoint.rolled_back"]["version"] == 1
    assert by_event["bluegreen.switched"]["version"] == 3
    assert by_event["bluegreen.switched"]["after"]["details"] == {"from": "blue", "to": "green"}


def test_test_button_sends_a_signed_ping_once_and_reports_the_answer(admin, receivers):
    ok, failing = receivers(), receivers(fail=5)
    good, bad = hook(admin, ok.url), hook(admin, failing.url, events=["version.failed"])

    r = admin.post(f"/api/v1/webhooks/{good['id']}/test/")
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["status"] == "succeeded" and body["event"] == "ping" and body["attempts"] == 1
    assert body["attempt_log"][0]["status_code"] == 200
    assert ok.calls[0]["verified"] and ok.calls[0]["json"]["actor"] == "admin"

    body = admin.post(f"/api/v1/webhooks/{bad['id']}/test/").json()  # filters do not apply
    assert body["status"] == "failed" and body["attempts"] == 1
    assert body["last_status_code"] == 500 and body["last_error"] == "HTTP 5xx"
    time.sleep(1.5)
    assert len(failing.calls) == 1  # a test is not retried
    assert AuditEvent.objects.filter(action="webhook.test").count() == 2


def test_an_unreachable_receiver_fails_after_max_attempts_with_the_error(admin, settings):
    settings.WEBHOOK_MAX_ATTEMPTS = 2
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hook(admin, f"http://127.0.0.1:{port}/hook")
    make_model("gone")
    services.endpoint_deploy(model_name="gone", version_number=1, actor=ME)
    services.canary_start(model_name="gone", version_number=2, actor=ME)
    [delivery] = wait_deliveries(1)
    assert delivery.status == DeliveryStatus.FAILED and delivery.attempts == 2
    assert delivery.last_status_code is None
    assert delivery.last_error == "no answer (connection failed)"
    assert delivery.attempt_log.count() == 2


def test_only_admins_manage_subscriptions_and_each_change_is_audited(client_for, admin):
    for role in ("viewer", "engineer"):
        c = client_for(role)
        assert c.get("/api/v1/webhooks/").status_code == 403
        assert c.post("/api/v1/webhooks/", {"url": "http://x.invalid/h"},
                      format="json").status_code == 403
    r = admin.post("/api/v1/webhooks/", {"url": "https://hooks.invalid/mmc",
                                         "events": ["version.ready"]}, format="json")
    assert r.status_code == 201
    created = r.json()
    assert len(created["secret"]) == 64 and created["model"] is None  # generated, shown once
    listed = admin.get("/api/v1/webhooks/").json()["results"]
    assert [h["id"] for h in listed] == [created["id"]] and "secret" not in listed[0]

    r = admin.post("/api/v1/webhooks/", {"url": "ftp://x"}, format="json")
    assert r.status_code == 400 and r.json()["field"] == "url"
    r = admin.post("/api/v1/webhooks/", {"url": "http://x.invalid", "events": ["nope"]},
                   format="json")
    assert r.status_code == 400 and "nope" in r.json()["error"]
    r = admin.post("/api/v1/webhooks/", {"url": "http://x.invalid", "model": "ghost"},
                   format="json")
    assert r.status_code == 404

    hid = created["id"]
    r = admin.patch(f"/api/v1/webhooks/{hid}/", {"active": False, "secret": "s" * 20},
                    format="json")
    assert r.status_code == 200 and r.json()["active"] is False
    assert admin.delete(f"/api/v1/webhooks/{hid}/").status_code == 204
    assert admin.get(f"/api/v1/webhooks/{hid}/").status_code == 404

    trail = list(AuditEvent.objects.filter(target_type="webhook").order_by("id"))
    assert [e.action for e in trail] == ["webhook.create", "webhook.update", "webhook.delete"]
    assert trail[1].before["active"] is True and trail[1].after["active"] is False
    assert trail[1].after["secret"] == "rotated"
    assert all(created["secret"] not in json.dumps([e.before, e.after]) for e in trail)
    assert all("s" * 20 not in json.dumps([e.before, e.after]) for e in trail)


@pytest.mark.parametrize(("action", "after", "event"), [
    ("version.ready", None, "version.ready"),
    ("version.failed", None, "version.failed"),
    ("endpoint.canary", None, "canary.started"),
    ("endpoint.promote", None, "canary.promoted"),
    ("endpoint.abort", None, "canary.rolled_back"),
    ("endpoint.rollback", {"state": "stable"}, "endpoint.rolled_back"),
    ("endpoint.rollback", {"state": "unloading"}, None),
    ("endpoint.switch", None, "bluegreen.switched"),
    ("endpoint.switch-back", None, "bluegreen.switched"),
    ("job.succeeded", None, "job.finished"),
    ("job.failed", None, "job.finished"),
    ("version.tensorrt.skipped", None, "job.finished"),
    ("monitor.drift", None, "monitor.drift"),          # an episode starts: one event
    ("monitor.drift.end", None, None),                 # its end is audited, not sent
    ("job.create", None, None),
    ("endpoint.canary.refused", None, None),
    ("webhook.test", None, None),
    ("version.upload", None, None),
])
def test_which_audit_actions_are_events(action, after, event):
    assert event_for(action, after) == event
