"""An engineer's day in a real browser: log in, create a model, upload with a progress bar,
watch it become ready without a reload, deploy, compare, try it; an admin reads the audit."""

from __future__ import annotations

import re

import pytest

from registry import samples

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def login(page, base: str, role: str) -> None:
    page.goto(f"{base}/login/")
    page.get_by_label("Username").fill(role)
    page.get_by_label("Password").fill(f"{role}-password-1")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base}/models/")


def logout(page) -> None:
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url(re.compile(r".*/login/"))


def upload(page, path, metadata: str, midway=None) -> None:
    page.set_input_files("#id_file", str(path))
    page.fill("#id_metadata", metadata)
    page.get_by_role("button", name="Upload", exact=True).click()
    if midway is not None:  # the bar moves in steps while bytes go out
        page.wait_for_function("() => { const v = document.getElementById('upload-progress')"
                               ".value; return v > 0 && v < 100; }")
        midway(page, "03a-upload-in-progress")
    page.wait_for_function(
        "() => document.getElementById('upload-percent').textContent === '100% uploaded'")
    assert page.eval_on_selector("#upload-progress", "e => e.value") == 100


def test_engineer_uploads_and_sees_ready_without_reload_then_admin_reads_audit(
        live_server, users, page, shot, tmp_path):
    from django.contrib.auth.models import User

    base = live_server.url
    page.goto(f"{base}/login/")
    shot(page, "01-login")
    login(page, base, "engineer")
    assert "role: engineer" in page.inner_text("header")
    assert "Database: ok" in page.inner_text(".health")

    page.get_by_role("link", name="New model").click()
    page.get_by_label("Name").fill("demo-mlp")
    page.get_by_label("Description").fill("A tiny MLP used by the browser test")
    page.get_by_label("Tags").fill("demo, team:ml")
    shot(page, "02-create-model")
    page.get_by_role("button", name="Create model").click()
    page.wait_for_url(f"{base}/models/demo-mlp/")
    assert "Model created." in page.inner_text(".messages")

    first = tmp_path / "mlp.onnx"
    first.write_bytes(samples.mlp(hidden=(512, 512)))  # 1.1 MiB
    page.evaluate("window.__sameDocument = true")
    cdp = page.context.new_cdp_session(page)  # slow the upload so the bar is seen moving
    cdp.send("Network.emulateNetworkConditions", {"offline": False, "latency": 5,
                                                  "downloadThroughput": -1,
                                                  "uploadThroughput": 400 * 1024})
    upload(page, first, '{"git_commit": "abc123", "dataset": "v7"}', midway=shot)
    cdp.send("Network.emulateNetworkConditions", {"offline": False, "latency": 0,
                                                  "downloadThroughput": -1,
                                                  "uploadThroughput": -1})
    page.wait_for_selector('#version-1[data-status="ready"]', timeout=60_000)
    assert page.evaluate("window.__sameDocument") is True  # no reload happened
    page.wait_for_selector('#versions[data-pending="false"]')  # polling stopped
    assert "ready" in page.inner_text("#version-1 .status")

    second = tmp_path / "mlp2.onnx"
    second.write_bytes(samples.mlp(seed=1, n_out=3))
    upload(page, second, '{"git_commit": "def456"}')
    page.wait_for_selector('#version-2[data-status="ready"]', timeout=60_000)
    assert page.evaluate("window.__sameDocument") is True

    page.get_by_role("textbox", name="Alias", exact=True).fill("prod")
    page.get_by_role("button", name="Set alias").click()
    page.wait_for_selector("text=now points at version")

    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("#version-1").get_by_role("button", name="Deploy as stable").click()
    page.wait_for_selector("text=Version 1 is now stable")
    assert "stable" in page.inner_text("#version-1")

    page.select_option("#id_a", "1")
    page.select_option("#id_b", "2")
    page.get_by_role("button", name="Compare").click()
    page.wait_for_selector("#diff-result table.diff")
    assert "changed" in page.inner_text("#diff-result")
    shot(page, "03-model-page")

    page.goto(f"{base}/models/")
    shot(page, "04-model-list")
    page.get_by_label("Search").fill("nothing-like-this")
    page.wait_for_selector("text=No models match.")
    page.get_by_label("Search").fill("demo")
    page.wait_for_selector("#model-table >> text=demo-mlp")

    page.goto(f"{base}/models/demo-mlp/versions/1/")
    assert "CPUExecutionProvider" in page.inner_text("body")
    assert page.input_value("#shape-1") == "1,64"
    page.get_by_role("button", name="Send request").click()
    page.wait_for_function(
        "() => document.getElementById('try-status').textContent.startsWith('HTTP')")
    status = page.inner_text("#try-status")
    shot(page, "05-version-page")
    if "HTTP 200" in status:  # /v2 is mounted (embedded single-process mode)
        assert '"outputs"' in page.inner_text("#try-response")
    else:  # live_server serves only Django; the form still built and sent the request
        assert status.startswith("HTTP 404")

    logout(page)
    login(page, base, "viewer")
    page.goto(f"{base}/models/demo-mlp/")
    assert page.locator("#upload-form").count() == 0
    assert page.get_by_role("button", name="Deploy as stable").count() == 0
    shot(page, "06-model-page-viewer")
    logout(page)

    User.objects.filter(username="admin").update(is_staff=True)
    login(page, base, "admin")
    page.get_by_role("link", name="Audit log").click()
    page.get_by_role("textbox", name="Model", exact=True).fill("demo-mlp")
    page.get_by_label("Action (prefix)").fill("version.upload")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_selector("#audit-table >> text=2 events")
    rows = page.inner_text("#audit-table tbody")
    assert "engineer" in rows and "version.upload" in rows and "demo-mlp:1" in rows
    shot(page, "07-audit")
    href = page.get_attribute("#csv-link", "href")
    assert "model=demo-mlp" in href
    csv = page.request.get(f"{base}{href}")
    assert csv.ok and csv.text().count("version.upload") == 2
