"""Data capture as an engineer sees it, on a real embedded console + serving process: the
deployment page's capture card turned on from its form, requests captured, the version page's
last captured requests, and a replay of one against another version, answers side by side."""

from __future__ import annotations

import time

import httpx
import pytest

from registry import samples, services
from registry.audit import Actor
from registry.models import ReplicaHeartbeat
from registry.monitoring import capture_store
from tests.replicas import replicas, wait_until

from .test_console_flow import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
ROW = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}


def loaded(replica: str, key: str) -> bool:
    versions = ReplicaHeartbeat.objects.filter(replica=replica).values_list(
        "versions", flat=True).first() or {}
    return (versions.get(key) or {}).get("state") == "READY"


def test_capture_card_captured_requests_and_replay(engineer, ready_model, page, shot,
                                                  tmp_path):
    ready_model("seen", samples.mlp(seed=1))
    ready_model("seen", samples.mlp(seed=2))
    services.endpoint_deploy(model_name="seen", version_number=1, actor=Actor.system("spec"))
    with replicas(1, embedded=True, log_dir=tmp_path, MMC_CAPTURE_FLUSH_SECONDS="0.3") as (rep,):
        wait_until(lambda: loaded(rep.name, "seen:1"), timeout=60, what="seen:1 loaded")
        base = rep.url
        login(page, base, "engineer")
        page.goto(f"{base}/models/seen/deployment/")
        card = page.locator("section#capture")
        card.get_by_label("Sampling (%)").fill("100")
        card.get_by_label("Keep (days)").fill("14")
        card.get_by_role("button", name="Save").click()
        page.wait_for_selector("#capture-percent:has-text('100 % of requests')")
        # v2 joins as a candidate without traffic: loaded, so a replay pinned to it answers
        services.canary_start(model_name="seen", version_number=2, weight=0,
                              actor=Actor.system("spec"))
        wait_until(lambda: loaded(rep.name, "seen:2"), timeout=60, what="seen:2 loaded")
        with httpx.Client(base_url=base, timeout=30) as http:
            wait_until(lambda: http.post("/v2/models/seen/infer", json=ROW,
                                         headers={"x-request-id": "warm"}).status_code == 200
                       and capture_store.find("seen", "warm", since=time.time() - 600),
                       timeout=30, what="the first captured request")
            for i in range(12):
                assert http.post("/v2/models/seen/infer", json=ROW,
                                 headers={"x-request-id": f"order-{i:03d}"}).status_code == 200
        wait_until(lambda: capture_store.find("seen", "order-011", since=time.time() - 600),
                   timeout=30, what="captured")
        page.goto(f"{base}/models/seen/deployment/")

        def counted() -> bool:  # heartbeats bring the counts; the card loads after the page
            page.reload()
            return int(page.wait_for_selector("#capture-captured").inner_text()) >= 13

        wait_until(counted, timeout=20, interval=1, what="13 captured on the card")
        card = page.locator("section#capture")
        card.scroll_into_view_if_needed()
        path = shot(page, "capture-card")
        card.screenshot(path=str(path.with_name("capture-card-only.png")))
        page.goto(f"{base}/models/seen/versions/1/#captured")
        page.wait_for_selector("#captured-rows")
        rows = page.locator("#captured-rows tbody tr")
        assert rows.first.get_attribute("data-request-id") == "order-011"
        page.locator("section#captured").screenshot(
            path=str(path.with_name("captured-requests.png")))
        rows.first.get_by_role("link").click()
        page.wait_for_selector("#replay-form")
        page.get_by_role("button", name="Run on v2").click()
        page.wait_for_selector("#replay-diff:has-text('argmax agrees')")
        assert "HTTP 200" in page.locator("#replay-status").inner_text()
        shot(page, "capture-replay")
