"""The console for daily work in a real browser: the upload status line follows the version to
ready, a webhook's test button delivers to a real receiver, serving settings are edited on the
version page; the audit page fits 1440 px. Screenshots go to /tmp/shots-console/ too."""

from __future__ import annotations

import json
import re
import shutil
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from registry import samples
from tests.browser.test_console_flow import login, logout, upload

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SHOTS = Path("/tmp/shots-console")


@pytest.fixture
def wide(chromium):
    context = chromium.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    page.set_default_timeout(20_000)
    yield page
    context.close()


def keep(shot, page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot(page, name), SHOTS / f"{name}.png")


@pytest.fixture
def receiver():
    """A real HTTP server on 127.0.0.1 that records every POST (headers and JSON body)."""
    got: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            got.append({"headers": dict(self.headers), "raw": body, "body": json.loads(body)})
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook", got
    server.shutdown()
    server.server_close()


def test_upload_status_line_turns_ready_then_serving_settings_are_edited(
        live_server, users, wide, shot, tmp_path):
    from registry import services
    from registry.audit import Actor
    from registry.models import ModelVersion

    services.model_create(name="scorer", actor=Actor.system("t"))
    base, page = live_server.url, wide
    login(page, base, "engineer")
    page.goto(f"{base}/models/scorer/")
    model = tmp_path / "mlp.onnx"
    model.write_bytes(samples.mlp())
    upload(page, model, '{"git_commit": "abc"}')
    page.wait_for_selector('#upload-result[data-status="ready"]', timeout=60_000)
    assert "Version 1 is ready" in page.inner_text("#upload-result")
    assert page.get_attribute("#upload-result", "hx-trigger") is None  # polling stopped

    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not an onnx model")
    upload(page, bad, "")
    page.wait_for_selector('#upload-result[data-status="failed"]', timeout=60_000)
    assert "Version 2 failed validation:" in page.inner_text("#upload-result")
    options = page.eval_on_selector_all("#id_alias_version option", "os => os.map(o => o.value)")
    assert options == ["1"]  # a failed version is not offered for an alias

    page.goto(f"{base}/models/scorer/versions/1/")
    page.get_by_label("Instances").fill("99")
    page.get_by_role("button", name="Save serving settings").click()
    page.wait_for_selector("text=Serving settings not saved")
    assert "less than or equal to 16" in page.inner_text("#serving")
    page.get_by_label("Instances").fill("3")
    page.get_by_label("Max queue delay (µs)").fill("2000")
    page.get_by_role("button", name="Save serving settings").click()
    page.wait_for_selector("text=Serving settings saved")
    said = page.inner_text(".messages")
    assert "Instances 1 → 3" in said and "Max queue delay (µs) 0 → 2000" in said
    assert page.input_value("#serving-instance_count") == "3"
    version = ModelVersion.objects.get(model__name="scorer", number=1)
    assert version.instance_count == 3 and version.max_queue_delay_us == 2000
    keep(shot, page, "version-page")


def test_webhook_test_button_delivers_to_a_real_receiver_and_audit_fits_1440(
        live_server, users, wide, shot, receiver):
    from django.contrib.auth.models import User

    url, got = receiver
    User.objects.filter(username="admin").update(is_staff=True)
    base, page = live_server.url, wide
    login(page, base, "admin")
    page.get_by_role("link", name="Webhooks").click()
    page.get_by_label("Name").fill("ci-notify")
    page.get_by_label("URL").fill(url)
    page.get_by_label("version.ready").check()
    page.get_by_label("canary.promoted").check()
    page.get_by_role("button", name="Add webhook").click()
    secret = page.inner_text("#new-secret").strip()
    assert len(secret) >= 32
    keep(shot, page, "webhooks-created")
    page.goto(f"{base}/webhooks/")
    assert secret not in page.content()  # shown once

    page.locator("#webhook-table tbody tr").first.get_by_role("button", name="Send test").click()
    page.wait_for_selector("text=Test delivered: the receiver answered HTTP 204")
    assert len(got) == 1 and got[0]["body"]["event"] == "ping"
    import hashlib
    import hmac

    signed = "sha256=" + hmac.new(secret.encode(), got[0]["raw"], hashlib.sha256).hexdigest()
    assert hmac.compare_digest(got[0]["headers"]["X-MMC-Signature"], signed)  # the secret shown
    assert 'data-status="succeeded"' in page.inner_html("#delivery-table")
    keep(shot, page, "webhook-deliveries")
    page.locator("#edit summary").click()  # edit its events in place; the secret stays
    page.get_by_label("canary.promoted").uncheck()
    page.get_by_label("version.failed").check()
    keep(shot, page, "webhook-edit")
    page.get_by_role("button", name="Save changes").click()
    page.wait_for_selector("text=saved.")
    assert "version.failed" in page.inner_text("main") and "canary.promoted" not in (
        page.inner_text("p.muted"))

    page.goto(f"{base}/webhooks/")
    page.get_by_role("button", name="Disable").click()
    page.wait_for_selector("#webhook-table >> text=disabled")
    keep(shot, page, "webhooks")

    _job_events()
    page.goto(f"{base}/audit/")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 1440, f"the audit page is {width} px wide"
    page.locator("#audit-table details").first.locator("summary").click()
    assert page.locator("#audit-table details[open] table.changes").count() == 1
    assert page.evaluate("document.documentElement.scrollWidth") <= 1440  # open, still fits
    assert "batch job 5f1c2e9a on v3 failed after 698,539 rows" in page.inner_text("#audit-table")
    keep(shot, page, "audit-1440")
    page.get_by_role("textbox", name="Action (prefix)").fill("webhook.")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**/audit/?*action=webhook.*")
    assert re.search(r"admin disabled webhook \d+", page.inner_text("#audit-table"))
    keep(shot, page, "audit-1440-filtered")
    page.reload()  # the filter lives in the URL
    assert page.input_value("#id_action") == "webhook."
    assert "created webhook" in page.inner_text("#audit-table")
    logout(page)


def _job_events() -> None:
    """Job-shaped audit events with long fields: what used to widen the table."""
    from registry.models import AuditEvent

    for status in ("succeeded", "failed"):
        AuditEvent.objects.create(
            actor_name="jobs", action=f"job.{status}", target_type="job",
            target="5f1c2e9a-7b7d-4f6e-9a51-0c1d2e3f4a5b", model_name="",
            after={"kind": "batch", "version": 3, "status": status, "rows": 698539,
                   "attempts": 1, "reason": "x" * 300 if status == "failed" else "",
                   "output": "s3://bucket/" + "very-long-path/" * 12})


def test_a_ten_percent_canary_label_is_readable_under_the_bar(live_server, users, ready_model,
                                                              wide):
    from registry import services
    from registry.audit import Actor

    ready_model("fraud", samples.mlp(seed=1))
    ready_model("fraud", samples.mlp(seed=2))
    system = Actor.system("t")
    services.endpoint_deploy(model_name="fraud", version_number=1, actor=system)
    services.canary_start(model_name="fraud", version_number=2, weight=10, actor=system)
    base, page = live_server.url, wide
    login(page, base, "engineer")
    page.goto(f"{base}/models/fraud/deployment/")
    label = page.locator(".split-label-out")
    assert label.inner_text() == "v2 candidate · 10 %"
    box, bar = label.bounding_box(), page.locator(".split").bounding_box()
    assert box["y"] >= bar["y"] + bar["height"] - 6  # under the bar, not inside it
    text_width = page.evaluate("() => { const r = document.createRange(); "
                               "r.selectNodeContents(document.querySelector('.split-label-out'));"
                               " return r.getBoundingClientRect().right; }")
    assert text_width <= bar["x"] + bar["width"] + 1  # not cut at the page's or bar's edge
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("#split").screenshot(path=str(SHOTS / "traffic-10pct.png"))
