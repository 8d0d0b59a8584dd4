"""The console for daily work: the corners the issue names, each as a user sees it."""

from __future__ import annotations

import pytest

from registry import services
from registry.audit import Actor
from registry.errors import LifecycleError
from tests.conftest import upload, wait_validated

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def failed_version(catalog, engineer):
    """fraud v3: bytes that are not ONNX, so validation fails."""
    number = upload(engineer, "fraud", b"not an onnx file").json()["number"]
    assert wait_validated(engineer, "fraud", number)["status"] == "failed"
    return number


def test_upload_status_line_polls_while_validating_then_says_ready(catalog, page_client):
    client = page_client("engineer")
    html = client.get("/models/fraud/versions/1/status/").content.decode()
    assert 'data-status="ready"' in html and "Version 1 is ready" in html
    assert "hx-trigger" not in html  # final: polling stops
    from registry.models import ModelVersion

    ModelVersion.objects.filter(model__name="fraud", number=2).update(status="validating")
    html = client.get("/models/fraud/versions/2/status/").content.decode()
    assert "validating…" in html and 'hx-trigger="every 1s"' in html


def test_upload_status_line_says_failed_with_the_reason(failed_version, page_client):
    html = page_client("engineer").get(
        f"/models/fraud/versions/{failed_version}/status/").content.decode()
    assert f"Version {failed_version} failed validation:" in html
    assert 'class="error"' in html and "hx-trigger" not in html


def test_alias_on_a_failed_version_is_refused_with_409_naming_why(failed_version, engineer):
    with pytest.raises(LifecycleError, match=f"version {failed_version} is failed"):
        services.alias_set(model_name="fraud", alias="prod", version_number=failed_version,
                           actor=Actor.system("test"))
    r = engineer.put("/api/v1/models/fraud/aliases/x/", {"version": failed_version},
                     format="json")
    assert r.status_code == 409 and "only point at a ready version" in r.json()["error"]


def test_alias_picker_offers_only_ready_versions(failed_version, page_client):
    html = page_client("engineer").get("/models/fraud/").content.decode()
    picker = html.split('id="id_alias_version"', 1)[1].split("</select>", 1)[0]
    assert 'value="1"' in picker and 'value="2"' in picker
    assert f'value="{failed_version}"' not in picker
    assert 'id="alias-version-help"' in html
