"""The version page of a version too new for the runtime offers the conversion to engineers (a
"Convert to IR x / opset y" button); pressing it opens the new version, which names its origin,
and the original then links to it. A refusal stays on the page with the reason."""

from __future__ import annotations

import pytest

from registry.signatures import runtime_limits
from tests import onnx_cases
from tests.conftest import upload, wait_validated

pytestmark = pytest.mark.django_db(transaction=True)
MAX_IR, MAX_OPSET = runtime_limits()
BUTTON = f"Convert to IR {MAX_IR} / opset {MAX_OPSET}"


def too_new(engineer, name: str, data: bytes) -> None:
    assert engineer.post("/api/v1/models/", {"name": name}, format="json").status_code == 201
    upload(engineer, name, data)
    assert wait_validated(engineer, name, 1)["status"] == "failed"


def test_an_engineer_converts_a_too_new_version_from_its_page(page_client, engineer):
    too_new(engineer, "today", onnx_cases.todays_mlp())
    viewer = page_client("viewer").get("/models/today/versions/1/").content.decode()
    assert "needs IR 14 / opset 28" in viewer and BUTTON not in viewer
    assert page_client("viewer").post("/models/today/versions/1/convert/").status_code == 403

    browser = page_client("engineer")
    page = browser.get("/models/today/versions/1/").content.decode()
    assert BUTTON in page and 'action="/models/today/versions/1/convert/"' in page
    r = browser.post("/models/today/versions/1/convert/", follow=True)
    assert r.redirect_chain[-1][0] == "/models/today/versions/2/"
    page = r.content.decode()
    assert f"Converted v1 to v2 (IR {MAX_IR}, opset {MAX_OPSET})" in page
    assert "rtol 0.0001, atol 1e-05" in page
    assert "Converted from" in page and 'href="/models/today/versions/1/"' in page
    assert "on generated inputs (rtol 0.0001, atol 1e-05)" in page
    wait_validated(engineer, "today", 2)
    page = browser.get("/models/today/versions/1/").content.decode()
    assert BUTTON not in page and 'Converted to <a href="/models/today/versions/2/">v2</a>' in page


def test_a_refused_conversion_stays_on_the_page_with_the_reason(page_client, engineer):
    too_new(engineer, "gated", onnx_cases.todays_swiglu())
    r = page_client("engineer").post("/models/gated/versions/1/convert/", follow=True)
    assert r.redirect_chain[-1][0] == "/models/gated/versions/1/#convert"
    assert "operator SwiGLU cannot be converted down to opset" in r.content.decode()
