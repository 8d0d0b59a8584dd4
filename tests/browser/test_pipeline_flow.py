"""A pipeline's version page in a real browser: the steps are drawn as boxes from the pipeline's
input to its output, and clicking a step opens the model version it runs."""

from __future__ import annotations

import hashlib

import onnx
import pytest

from registry import samples, services
from registry.audit import Actor
from registry.models import ModelVersion, VersionStatus
from registry.services.pipelines import pipeline_create
from registry.signatures import extract_signature

from .conftest import SCREENSHOTS
from .test_console_flow import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def ready(model: str, data: bytes, user) -> None:
    """A ready version row (the drawing needs no artifact, only the signature)."""
    m = services.model_create(name=model, actor=Actor(user=user, name=user.username))
    ModelVersion.objects.create(model=m, number=1, sha256=hashlib.sha256(data).hexdigest(),
                                size_bytes=len(data), status=VersionStatus.READY,
                                max_batch_size=32, created_by=user,
                                signature=extract_signature(onnx.load_from_string(data)))


def test_the_version_page_draws_the_pipeline_and_a_step_opens_its_version(live_server, users,
                                                                          page, shot):
    engineer = users["engineer"]
    ready("scaler", samples.scale(2.0), engineer)
    ready("adder", samples.add(), engineer)
    services.alias_set(model_name="scaler", alias="production", version_number=1,
                       actor=Actor.system("test"))
    services.model_create(name="pipe", actor=Actor.system("test"))
    pipeline_create(model_name="pipe", actor=Actor(user=engineer, name="engineer"), spec={
        "steps": [{"name": "double", "model": "scaler", "alias": "production"},
                  {"name": "sum", "model": "adder", "version": 1}],
        "edges": [{"from": "x", "to": "double.x"}, {"from": "double.y", "to": "sum.a"},
                  {"from": "x", "to": "sum.b"}, {"from": "sum.sum", "to": "y"}]})
    base = live_server.url
    login(page, base, "viewer")
    page.goto(f"{base}/models/pipe/versions/1/")
    drawing = page.locator("#pipeline svg")
    box = drawing.bounding_box()
    assert box["width"] > 600 and box["height"] > 60  # drawn, not collapsed
    titles = page.locator("#pipeline .node-title").all_text_contents()
    assert titles == ["input x", "double", "sum", "output y"]
    # The input's box is left of the first step, which is left of the second, then the output.
    xs = [page.locator(f'[data-node="{n}"] rect').bounding_box()["x"]
          for n in ("input:x", "step:double", "step:sum", "output:y")]
    assert xs == sorted(xs) and len(set(xs)) == 4
    assert page.locator("#pipeline path.wire").count() == 4
    shot(page, "pipeline-version")
    page.locator("#pipeline").screenshot(path=str(SCREENSHOTS / "pipeline-drawing.png"))
    page.locator('[data-node="step:double"]').click()
    page.wait_for_url(f"{base}/models/scaler/versions/1/")
    assert "scaler · version 1" in page.inner_text("h1")
