"""The response cache in a real browser: an engineer ticks it in the version page's serving form,
a replica following the registry answers a repeated request from it, and the page shows the
replica's hits and misses."""

from __future__ import annotations

import asyncio
import threading

import orjson
import pytest

from registry import samples
from tests.browser.test_console_flow import login, upload

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def serve_three_identical_requests() -> None:
    """A replica in this process follows the registry, answers the same row three times and
    sends its heartbeat, as `mmc-serve --registry` does."""
    from registry.serving_source import RegistrySource
    from serving.core.dataplane import DataPlane
    from serving.core.reconciler import Reconciler
    from serving.http.codec import decode_infer_request

    dataplane = DataPlane(replica="browser-r1")
    reconciler = Reconciler(RegistrySource(), dataplane, intra_op_threads=1)
    body = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32",
                                     "data": [0.5] * 64}]})

    async def main():
        await reconciler.reconcile()
        for _ in range(3):
            await dataplane.predict("scorer", None, decode_infer_request(body))
        await reconciler.stop()

    # In a thread of its own: playwright's sync API keeps an event loop in this one.
    worker = threading.Thread(target=asyncio.run, args=(main(),))
    worker.start()
    worker.join(60)
    RegistrySource().report(reconciler.observed())


def test_the_engineer_turns_the_cache_on_and_reads_its_hits(live_server, users, page, shot,
                                                            tmp_path):
    from registry import services
    from registry.audit import Actor
    from registry.models import ModelVersion

    services.model_create(name="scorer", actor=Actor.system("t"))
    base = live_server.url
    login(page, base, "engineer")
    page.goto(f"{base}/models/scorer/")
    model = tmp_path / "mlp.onnx"
    model.write_bytes(samples.mlp())
    upload(page, model, "")
    page.wait_for_selector('#upload-result[data-status="ready"]', timeout=60_000)
    services.endpoint_deploy(model_name="scorer", version_number=1, actor=Actor.system("t"))

    page.goto(f"{base}/models/scorer/versions/1/")
    assert "Response cache: off" in page.inner_text("#response-cache")
    assert not page.is_checked("#serving-response_cache")
    page.get_by_label("Response cache").check()
    page.get_by_role("button", name="Save serving settings").click()
    page.wait_for_selector("text=Serving settings saved")
    assert "Response cache off → on" in page.inner_text(".messages")
    assert page.is_checked("#serving-response_cache")
    assert ModelVersion.objects.get(model__name="scorer", number=1).response_cache is True

    serve_three_identical_requests()
    page.reload()
    line = page.inner_text("#response-cache")
    assert "Response cache: on" in line and "2 hits, 1 miss (67 % hits)" in line, line
    shot(page, "version-response-cache")
    page.locator("#serving").screenshot(path=str(shot(page, "version-response-cache").with_name(
        "version-response-cache-card.png")))
