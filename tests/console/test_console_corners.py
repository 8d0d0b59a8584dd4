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


def test_audit_page_says_each_event_in_words_with_only_changed_fields(catalog, page_client):
    system = Actor.system("test")
    services.endpoint_deploy(model_name="fraud", version_number=1, actor=system)
    services.endpoint_deploy(model_name="fraud", version_number=2, actor=system,
                             reason="better recall")
    services.model_update(name="fraud", description="new words", actor=system)
    html = page_client("admin").get("/audit/?model=fraud").content.decode()
    assert "deployed v2 of fraud (was v1), reason “better recall”" in html
    assert "pointed alias prod of fraud at v1" in html
    assert "<details><summary>" in html
    row = html.split('data-action="model.update"', 1)[1].split("</tr>\n", 1)[0]
    assert "<code>description</code>" in row and "new words" in row
    assert "<code>tags</code>" not in row  # unchanged fields are left out
    assert "…" not in html.split('id="audit-table"', 1)[1]  # nothing cut short


def test_audit_filters_stay_in_the_url_and_the_form(catalog, page_client):
    html = page_client("admin").get("/audit/?model=fraud&action=alias.").content.decode()
    assert 'hx-push-url="true"' in html
    assert 'id="id_model" name="model" value="fraud"' in html
    assert "1 event" in html
