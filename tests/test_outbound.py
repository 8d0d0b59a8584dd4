"""Outbound requests (webhooks, job callbacks) go only to public addresses unless the operator's
allow-list (MMC_OUTBOUND_ALLOW) says otherwise: checked when the URL is given and again on the
resolved address at connect time, no redirects, and a failure says only what class of failure
it was, never what answered.

tests/settings.py allows loopback for the other specs; these set `settings.OUTBOUND_ALLOW` to
prove the default. Receivers live on 127.0.0.1 only; a "public" answer comes from a stand-in
resolver and is never contacted (the `loopback_only` guard fails a spec that tries)."""

from __future__ import annotations

import ipaddress
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from registry.integrations.callbacks import deliver
from registry.integrations.outbound import post_signed
from registry.integrations.webhooks import attempt_delivery
from registry.models import Job, WebhookDelivery, WebhookSubscription
from tests.test_jobs import async_json, mlp, wait_job  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db(transaction=True)
SECRET = "receiver-secret-0123456789"
PUBLIC = "1.2.3.4"  # only ever an answer of the stand-in resolver, never contacted


class Answering:
    """An HTTP receiver on 127.0.0.1 that answers every POST with the same status, body and
    headers, and records each call."""

    def __init__(self, status: int = 200, body: bytes = b"ok", headers: dict | None = None):
        self.calls: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.calls.append(self.path)
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST  # noqa: N815 (a followed redirect would arrive as GET)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class NotHttp:
    """A TCP service on 127.0.0.1 that is not HTTP (it greets like Redis and hangs up)."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with conn:
                conn.sendall(b"-ERR unknown command 'POST', redis_version:7.0.15\r\n")

    def close(self):
        self.sock.close()


@pytest.fixture
def serve():
    made = []

    def make(kind=Answering, **kwargs):
        made.append(kind(**kwargs))
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.fixture
def dns(monkeypatch):
    """A stand-in resolver: names put in the returned dict answer with that address; every other
    name goes to the real resolver."""
    answers: dict[str, str] = {}
    real = socket.getaddrinfo

    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):  # noqa: A002
        name = host.decode() if isinstance(host, bytes) else host
        if name in answers:
            ip = ipaddress.ip_address(answers[name])
            fam = socket.AF_INET if ip.version == 4 else socket.AF_INET6
            sockaddr = (str(ip), int(port or 0)) + (() if ip.version == 4 else (0, 0))
            return [(fam, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", sockaddr)]
        return real(host, port, family, type, proto, flags)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return answers


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    """Fail the spec, before any packet leaves, if anything in this process connects to an
    address that is not loopback."""
    real = socket.create_connection

    def create_connection(address, *args, **kwargs):
        host = address[0]
        for *_, sockaddr in socket.getaddrinfo(host, address[1], type=socket.SOCK_STREAM):
            if not ipaddress.ip_address(sockaddr[0].split("%")[0]).is_loopback:
                raise AssertionError(f"a spec tried to reach {host} ({sockaddr[0]})")
        return real(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", create_connection)


def hook(admin, url: str):
    return admin.post("/api/v1/webhooks/", {"url": url, "secret": SECRET}, format="json")


def ping(admin, webhook_id: int) -> dict:
    r = admin.post(f"/api/v1/webhooks/{webhook_id}/test/")
    assert r.status_code == 200, r.content
    return r.json()


def test_a_webhook_to_a_loopback_address_is_refused_in_every_encoding(admin, settings, serve,
                                                                     dns):
    settings.OUTBOUND_ALLOW = []
    receiver = serve()
    dns["rebind.example"] = "127.0.0.1"
    dns["v6.example"] = "::1"
    dns["hooks.example"] = PUBLIC
    port = receiver.port
    hosts = ["127.0.0.1", "localhost", "LOCALHOST.", "[::1]", "2130706433", "0x7f000001", "0",
             "0.0.0.0", "0177.0.0.1", "127.1", "[::ffff:127.0.0.1]", "[::127.0.0.1]",
             "[::ffff:7f00:1]", "169.254.169.254", "10.0.0.1", "192.168.1.1", "172.16.0.1",
             "100.64.0.1", "[fe80::1]", "[fc00::1]", "224.0.0.1", "rebind.example",
             "v6.example", "user:pw@example.com@127.0.0.1", "db.localhost"]
    for host in hosts:
        for url in (f"http://{host}:{port}/hook", f"https://{host}/hook"):
            r = hook(admin, url)
            assert r.status_code == 400, (url, r.content)
            assert r.json()["field"] == "url", url
    assert "must point to a public address" in hook(admin, "http://2130706433/").json()["error"]
    for url in (f"http://127.0.0.1:{port}/", "http://127.0.0.1:5432/", "http://[::1]:6379/"):
        assert hook(admin, "https://hooks.example/mmc").status_code == 201
        sub = WebhookSubscription.objects.latest("id")
        r = admin.patch(f"/api/v1/webhooks/{sub.pk}/", {"url": url}, format="json")
        assert r.status_code == 400 and r.json()["field"] == "url", url
    assert receiver.calls == []
    assert not WebhookSubscription.objects.exclude(url="https://hooks.example/mmc").exists()


def test_a_callback_url_to_a_private_address_is_refused_at_creation(engineer, mlp, settings,  # noqa: F811
                                                                    dns):
    settings.OUTBOUND_ALLOW = []
    dns["metadata.example"] = "169.254.169.254"
    x = np.ones((1, 64), dtype=np.float32)
    for url in ("http://10.0.0.1/hook", "http://127.0.0.1:6379/", "http://0x7f000001:5432/",
                "http://169.254.169.254/latest/meta-data/", "http://metadata.example/",
                "http://[::1]:8000/api/v1/models/", "ftp://example.com/"):
        r = async_json(engineer, "mlp", x, HTTP_X_MMC_CALLBACK_URL=url)
        assert r.status_code == 400, (url, r.content)
        assert r.json()["field"] == "callback_url", url
    assert not Job.objects.exists()


def test_an_address_that_resolves_elsewhere_at_send_time_is_refused(admin, settings, serve,
                                                                   dns):
    settings.OUTBOUND_ALLOW = []
    receiver = serve()
    dns["rebind.example"] = PUBLIC  # public when the URL is checked...
    r = hook(admin, f"http://rebind.example:{receiver.port}/hook")
    assert r.status_code == 201, r.content
    dns["rebind.example"] = "127.0.0.1"  # ...loopback when it is time to connect
    body = ping(admin, r.json()["id"])
    assert body["status"] == "failed" and body["last_status_code"] is None
    assert body["last_error"].startswith("refused: ")
    assert body["attempt_log"][0]["error"] == body["last_error"]
    event = WebhookDelivery.objects.create(subscription_id=r.json()["id"], event="ping",
                                           body="{}", max_attempts=5)
    assert attempt_delivery(event.pk) == "failed"  # a refusal is not retried
    event.refresh_from_db()
    assert event.attempts == 1 and event.last_error.startswith("refused: ")
    sent = post_signed(f"http://rebind.example:{receiver.port}/x", b"{}", {}, secret=SECRET)
    assert not sent.ok and not sent.retryable and sent.error.startswith("refused: ")
    assert receiver.calls == []  # the POST was never made


def test_a_job_callback_is_checked_again_at_send_time(engineer, mlp, settings, serve, dns):  # noqa: F811
    receiver = serve()
    r = async_json(engineer, "mlp", np.ones((1, 64), dtype=np.float32),
                   HTTP_X_MMC_CALLBACK_URL=receiver.url)
    assert r.status_code == 202, r.content
    done = wait_job(engineer, r.json()["id"], what=lambda b: b["callback_status"])
    assert done["callback_status"] == "delivered: HTTP 200 on attempt 1"
    settings.OUTBOUND_ALLOW = []
    dns["moved.example"] = "127.0.0.1"
    for url in (receiver.url, f"http://moved.example:{receiver.port}/hook"):
        Job.objects.filter(pk=done["id"]).update(callback_url=url)
        outcome = deliver(Job.objects.select_related("version__model").get(pk=done["id"]))
        assert outcome.startswith("failed after 1 attempt(s): refused: "), outcome
        assert engineer.get(f"/api/v1/jobs/{done['id']}/").json()["callback_status"] == outcome
    assert len(receiver.calls) == 1


def test_redirects_are_not_followed(admin, serve):
    target = serve()
    redirecting = serve(status=302, body=b"", headers={"Location": target.url})
    body = ping(admin, hook(admin, redirecting.url).json()["id"])
    assert body["status"] == "failed" and body["last_error"] == "HTTP 3xx"
    assert len(redirecting.calls) == 1 and target.calls == []


def test_a_failed_delivery_reveals_only_the_status_class(admin, engineer, mlp, serve):  # noqa: F811
    leaky = "postgres 15.4 on internal-db-7, role=replicator"
    server_error = serve(status=500, body=leaky.encode())
    not_found = serve(status=404, body=leaky.encode())
    body = ping(admin, hook(admin, server_error.url).json()["id"])
    assert body["last_error"] == "HTTP 5xx" and body["attempt_log"][0]["error"] == "HTTP 5xx"
    assert leaky not in str(body)

    # Something that is not HTTP and a port nobody listens on look the same to the caller.
    redis_like = serve(NotHttp)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    answers = {port: post_signed(f"http://127.0.0.1:{port}/", b"{}", {}, timeout=5)
               for port in (redis_like.port, closed)}
    assert redis_like.accepted >= 1
    assert {o.error for o in answers.values()} == {"no answer (connection failed)"}
    assert all(o.status_code is None and o.retryable for o in answers.values())
    for port in (redis_like.port, closed):
        body = ping(admin, hook(admin, f"http://127.0.0.1:{port}/hook").json()["id"])
        assert body["last_error"] == "no answer (connection failed)"
    assert not any("redis" in d.last_error.lower() for d in WebhookDelivery.objects.all())

    # The engineer's view of a job callback follows the same rule.
    r = async_json(engineer, "mlp", np.ones((1, 64), dtype=np.float32),
                   HTTP_X_MMC_CALLBACK_URL=not_found.url)
    done = wait_job(engineer, r.json()["id"], what=lambda b: b["callback_status"])
    assert done["callback_status"] == "failed after 1 attempt(s): HTTP 4xx"
    assert len(not_found.calls) == 1


def test_the_allow_list_admits_an_operator_named_network(admin, settings, serve, dns):
    receiver = serve()
    dns["hooks.internal"] = dns["other.internal"] = "127.0.0.1"
    settings.OUTBOUND_ALLOW = []
    assert hook(admin, receiver.url).status_code == 400

    settings.OUTBOUND_ALLOW = ["127.0.0.0/8"]
    r = hook(admin, receiver.url)
    assert r.status_code == 201, r.content
    assert ping(admin, r.json()["id"])["status"] == "succeeded"
    assert hook(admin, f"http://[::1]:{receiver.port}/hook").status_code == 400  # v6: not named

    settings.OUTBOUND_ALLOW = ["hooks.internal"]  # a host name admits that name, not others
    r = hook(admin, f"http://hooks.internal:{receiver.port}/hook")
    assert r.status_code == 201, r.content
    assert ping(admin, r.json()["id"])["status"] == "succeeded"
    assert hook(admin, f"http://other.internal:{receiver.port}/hook").status_code == 400
    assert hook(admin, receiver.url).status_code == 400
    assert len(receiver.calls) == 2

    settings.OUTBOUND_ALLOW = ["0.0.0.0/0"]  # even "everything" never means 0.0.0.0
    assert hook(admin, f"http://0:{receiver.port}/hook").status_code == 400
