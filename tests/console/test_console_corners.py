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
    # back to what it was: nothing is really validating (the teardown waits for those)
    ModelVersion.objects.filter(model__name="fraud", number=2).update(status="ready")


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


def test_every_aria_describedby_points_at_an_element_on_the_page(catalog, page_client):
    import re

    services.endpoint_deploy(model_name="fraud", version_number=1, actor=Actor.system("test"))
    client = page_client("admin")
    for url in ("/models/", "/models/new/", "/models/fraud/", "/models/fraud/versions/1/",
                "/models/fraud/deployment/", "/tokens/", "/users/", "/audit/", "/jobs/",
                "/webhooks/"):
        r = client.get(url)
        if r.status_code == 404 and url == "/webhooks/":
            continue
        html = r.content.decode()
        ids = set(re.findall(r'\bid="([^"]+)"', html))
        for refs in re.findall(r'aria-describedby="([^"]+)"', html):
            for ref in refs.split():
                assert ref in ids, f"{url}: aria-describedby={ref!r} has no element"


def test_not_found_page_names_the_path_not_the_exception_class(page_client):
    html = page_client("viewer").get("/no/such/page/").content.decode()
    assert "Resolver404" not in html and "No page at <code>/no/such/page/</code>" in html


def test_favicon_is_served_from_static_and_linked(page_client, client):
    r = client.get("/favicon.ico")
    assert r.status_code == 301 and r["Location"].endswith("favicon.svg")
    html = page_client("viewer").get("/models/").content.decode()
    assert 'rel="icon"' in html


def test_a_refused_request_logs_one_warning_line_without_traceback(page_client, caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="django.request"):
        assert page_client("viewer").get("/audit/").status_code == 403
    records = [r for r in caplog.records if r.name == "django.request"]
    assert records  # the logger's own filter (settings.LOGGING) has already run
    for record in records:
        assert record.levelname == "WARNING" and record.exc_info is None
        assert "Forbidden" in record.getMessage() and "admin role" in record.getMessage()


def test_job_rates_read_with_separators_and_sensible_precision():
    from console.templatetags.console import rate

    assert rate(698539.6) == "698,540" and rate(12.34) == "12.3" and rate(0.456) == "0.46"


def test_cli_versions_prints_a_header(capsys):
    from mmc import Version
    from registry.cli.main import cmd_versions

    class Fake:
        def list_versions(self, model, **filters):
            return [Version.of({"number": 1, "status": "ready", "sha256": "a" * 64,
                                "size_bytes": 10, "aliases": [], "failure_reason": ""})]

    class Args:
        model = "m"
        metric = metadata = None

    cmd_versions(Fake(), Args())
    first = capsys.readouterr().out.splitlines()[0]
    assert "STATUS" in first and "SHA256" in first


def test_version_page_says_whether_it_is_stable_and_which_aliases_point_at_it(
        catalog, page_client):
    services.endpoint_deploy(model_name="fraud", version_number=1, actor=Actor.system("test"))
    client = page_client("viewer")
    one = client.get("/models/fraud/versions/1/").content.decode()
    role = one.split('id="version-role"', 1)[1].split("</p>", 1)[0]
    assert "stable" in role and "@prod" in role
    two = client.get("/models/fraud/versions/2/").content.decode()
    role = two.split('id="version-role"', 1)[1].split("</p>", 1)[0]
    assert "Not serving" in role and "none point at it" in role


def test_engineer_edits_description_and_tags_then_archives_and_unarchives(catalog, page_client):
    client = page_client("engineer")
    page = client.get("/models/fraud/edit/").content.decode()
    assert "card fraud scorer" in page and "team:risk" in page
    r = client.post("/models/fraud/edit/", {"description": "scores card fraud",
                                            "tags": "team:risk, gbm"})
    assert r.status_code == 302
    from registry.models import RegisteredModel

    model = RegisteredModel.objects.get(name="fraud")
    assert model.description == "scores card fraud" and model.tags == ["gbm", "team:risk"]
    assert client.post("/models/fraud/edit/", {"tags": "bad tag!"}).status_code == 400
    client.post("/models/fraud/archive/", {"reason": "replaced"})
    assert RegisteredModel.objects.get(name="fraud").archived
    html = client.get("/models/fraud/").content.decode()
    assert "Unarchive" in html and "Model archived" in html
    client.post("/models/fraud/unarchive/")
    assert not RegisteredModel.objects.get(name="fraud").archived
    assert page_client("viewer").post("/models/fraud/archive/").status_code == 403


def test_serving_settings_form_saves_changes_and_says_the_effect(catalog, page_client):
    client = page_client("engineer")
    html = client.get("/models/fraud/versions/1/").content.decode()
    assert 'id="serving-instance_count"' in html and 'max="16"' in html
    data = {"max_batch_size": 8, "max_queue_delay_us": 500, "max_queue_size": 256,
            "instance_count": 2, "intra_op_threads": 0, "max_output_bytes": 0,
            "preferred_batch_sizes": "4, 8", "graph_optimization_level": "all"}
    from registry.models import ModelVersion

    version = ModelVersion.objects.get(model__name="fraud", number=1)
    data["graph_optimization_level"] = version.graph_optimization_level
    r = client.post("/models/fraud/versions/1/serving/", data, follow=True)
    page = r.content.decode()
    assert "Serving settings saved" in page and "Instances 1 → 2" in page
    version.refresh_from_db()
    assert version.instance_count == 2 and version.preferred_batch_sizes == [4, 8]
    bad = client.post("/models/fraud/versions/1/serving/", {**data, "instance_count": 99})
    assert bad.status_code == 400 and "less than or equal to 16" in bad.content.decode()
    assert page_client("viewer").post("/models/fraud/versions/1/serving/", data).status_code == 403


def test_admin_creates_a_webhook_sees_the_secret_once_disables_and_reads_its_log(
        catalog, page_client):
    from registry.models import WebhookSubscription

    client = page_client("admin")
    page = client.get("/webhooks/").content.decode()
    assert "version.ready" in page and "Add webhook" in page
    r = client.post("/webhooks/", {"name": "ci", "url": "http://127.0.0.1:9/hook",
                                   "model": "fraud", "events": ["version.ready"]})
    sub = WebhookSubscription.objects.get()
    html = r.content.decode()
    assert r.status_code == 200 and sub.secret in html and r["Cache-Control"] == "no-store"
    assert sub.events == ["version.ready"] and sub.model.name == "fraud"
    assert sub.secret not in client.get("/webhooks/").content.decode()  # once
    client.post(f"/webhooks/{sub.pk}/disable/")
    sub.refresh_from_db()
    assert not sub.active
    client.post(f"/webhooks/{sub.pk}/enable/")
    sub.refresh_from_db()
    assert sub.active
    bad = client.post("/webhooks/", {"url": "http://10.1.2.3/x"})
    assert bad.status_code == 400
    assert page_client("engineer").get("/webhooks/").status_code == 403
    assert client.get(f"/webhooks/{sub.pk}/").status_code == 200


def test_admin_edits_a_webhooks_url_and_events_on_its_page_audited_secret_kept(
        catalog, page_client):
    from registry.models import AuditEvent, WebhookSubscription

    client = page_client("admin")
    client.post("/webhooks/", {"name": "ci", "url": "http://127.0.0.1:9/hook",
                               "events": ["version.ready"]})
    sub = WebhookSubscription.objects.get()
    secret = sub.secret
    page = client.get(f"/webhooks/{sub.pk}/").content.decode()
    assert 'value="http://127.0.0.1:9/hook"' in page and "Save changes" in page
    r = client.post(f"/webhooks/{sub.pk}/", {"name": "ci", "url": "http://127.0.0.1:9/new",
                                            "model": "fraud",
                                            "events": ["version.ready", "version.failed"]})
    assert r.status_code == 302
    sub.refresh_from_db()
    assert (sub.url, sub.model.name, sub.events, sub.secret) == (
        "http://127.0.0.1:9/new", "fraud", ["version.failed", "version.ready"], secret)
    event = AuditEvent.objects.get(action="webhook.update")
    assert event.before["url"].endswith("/hook") and event.after["url"].endswith("/new")
    bad = client.post(f"/webhooks/{sub.pk}/", {"url": "http://10.1.2.3/x"})
    assert bad.status_code == 400 and "10.1.2.3" in bad.content.decode()
    sub.refresh_from_db()
    assert sub.url.endswith("/new")  # nothing half-written
    assert page_client("engineer").post(f"/webhooks/{sub.pk}/", {"url": "http://x"}
                                        ).status_code == 403


def test_engineer_starts_a_batch_transform_from_the_console_by_uploading_a_dataset(
        catalog, page_client):
    import io

    import numpy as np
    from django.core.files.uploadedfile import SimpleUploadedFile

    from registry.models import Job

    client = page_client("engineer")
    page = client.get("/models/fraud/batch/").content.decode()
    assert "Start batch transform" in page and 'value="2"' in page
    buffer = io.BytesIO()
    np.save(buffer, np.zeros((50, 64), dtype=np.float32))
    r = client.post("/models/fraud/batch/", {
        "version": 1, "output_format": "",
        "file": SimpleUploadedFile("rows.npy", buffer.getvalue())})
    job = Job.objects.get()
    assert r.status_code == 302 and r["Location"] == f"/jobs/{job.pk}/"
    assert job.version.number == 1 and job.rows_total == 50
    again = client.post("/models/fraud/batch/", {"version": 2, "dataset": str(job.dataset_id)})
    assert again.status_code == 302 and Job.objects.count() == 2
    assert client.post("/models/fraud/batch/", {"version": 1}).status_code == 400
    assert page_client("viewer").get("/models/fraud/batch/").status_code == 403


@pytest.fixture
def canary(ready_model):
    """"scorer": v1 stable, v2 a canary at 10 %."""
    from registry import samples

    ready_model("scorer", samples.mlp(seed=1))
    ready_model("scorer", samples.mlp(seed=2))
    system = Actor.system("test")
    services.endpoint_deploy(model_name="scorer", version_number=1, actor=system)
    services.canary_start(model_name="scorer", version_number=2, weight=10, actor=system)
    return "scorer"


def test_a_narrow_traffic_segment_has_its_label_under_the_bar_and_one_revision_counter(
        canary, page_client):
    html = page_client("viewer").get("/models/scorer/deployment/").content.decode()
    bar = html.split('class="split"', 1)[1].split("</div>", 1)[0]
    assert "v1 stable · 90 %" in bar and "v2 candidate" not in bar  # never clipped inside
    under = html.split('class="split-labels"', 1)[1].split("</div>", 1)[0]
    assert "v2 candidate · 10 %" in under
    assert "endpoint revision" not in html
    assert "replica applied it" in html or "replicas applied it" in html


def test_after_an_automated_promote_the_redrawn_controls_hide_the_plan_and_old_banners(
        canary, page_client):
    services.canary_promote(model_name="scorer", actor=Actor.system("canary-analysis"))
    html = page_client("engineer").get("/models/scorer/deployment/live/?rev=1").content.decode()
    assert 'id="controls" aria-labelledby="controls-h" hx-swap-oob="true"' in html
    assert 'id="canary-plan" hidden' in html
    assert '<ul class="messages" id="messages" role="status" hx-swap-oob="true"></ul>' in html
