"""Every console page for every role: who sees what, who may change what, and that every change
goes through the registry's services (audited) with their errors shown as messages."""

from __future__ import annotations

import pytest

from registry.models import Alias, AuditEvent, Endpoint, ModelVersion, RegisteredModel

pytestmark = pytest.mark.django_db(transaction=True)

ROLES = ["viewer", "engineer", "admin"]
WRITERS = {"engineer", "admin"}

READ_PAGES = [
    "/models/",
    "/models/fraud/",
    "/models/fraud/versions/",
    "/models/fraud/versions/1/",
    "/models/fraud/diff/?a=1&b=2",
]
MUTATING_MARKERS = ['id="upload-form"', "Deploy as stable", "Set alias", ">Remove<",
                    "New model"]


@pytest.mark.parametrize("url", READ_PAGES + ["/models/new/", "/audit/", "/audit/export.csv"])
def test_anonymous_users_are_sent_to_the_login_page(page_client, url):
    r = page_client(None).get(url)
    assert r.status_code == 302
    assert r["Location"].startswith("/login/?next=")


def test_a_user_without_a_role_is_refused_every_page(page_client, catalog):
    client = page_client("nobody")
    for url in READ_PAGES:
        assert client.get(url).status_code == 403, url


def test_login_page_logs_in_and_shows_the_role_in_the_header(users, client):
    assert client.get("/login/").status_code == 200
    r = client.post("/login/", {"username": "engineer", "password": "engineer-password-1"},
                    follow=True)
    assert r.status_code == 200
    html = r.content.decode()
    assert "role: <strong>engineer</strong>" in html
    assert client.post("/logout/").status_code == 302
    assert client.get("/models/").status_code == 302


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("url", READ_PAGES)
def test_every_role_reads_every_registry_page(page_client, catalog, role, url):
    r = page_client(role).get(url)
    assert r.status_code == 200, r.content[:500]


@pytest.mark.parametrize("role", ROLES)
def test_mutating_buttons_show_only_for_engineers_and_admins(page_client, catalog, role):
    client = page_client(role)
    html = client.get("/models/fraud/").content.decode() + client.get("/models/").content.decode()
    for marker in MUTATING_MARKERS:
        assert (marker in html) == (role in WRITERS), (role, marker)
    assert f"role: <strong>{role}</strong>" in html


@pytest.mark.parametrize("role", ROLES)
def test_create_model_form_is_for_engineers(page_client, users, role):
    client = page_client(role)
    assert client.get("/models/new/").status_code == (200 if role in WRITERS else 403)
    r = client.post("/models/new/", {"name": f"m-{role}", "description": "d",
                                     "tags": "vision, team:ads"})
    if role in WRITERS:
        assert r.status_code == 302 and r["Location"] == f"/models/m-{role}/"
        model = RegisteredModel.objects.get(name=f"m-{role}")
        assert model.tags == ["team:ads", "vision"] and model.owner == users[role]
        assert AuditEvent.objects.filter(action="model.create", actor_name=role).exists()
    else:
        assert r.status_code == 403
        assert not RegisteredModel.objects.filter(name=f"m-{role}").exists()


def test_service_errors_are_shown_to_the_user(page_client, catalog):
    client = page_client("engineer")
    r = client.post("/models/new/", {"name": "fraud"})
    assert r.status_code == 400
    assert "a model named &#x27;fraud&#x27; already exists" in r.content.decode()
    r = client.post("/models/new/", {"name": "Bad Name"})
    assert "lowercase letters" in r.content.decode()
    r = client.post("/models/fraud/aliases/", {"alias": "prod", "version": 9}, follow=True)
    assert "has no version 9" in r.content.decode()


@pytest.mark.parametrize("role", ROLES)
def test_alias_set_and_remove_need_engineer(page_client, catalog, role):
    client = page_client(role)
    r = client.post("/models/fraud/aliases/", {"alias": "canary", "version": 2})
    removed = client.post("/models/fraud/aliases/prod/remove/")
    aliases = dict(Alias.objects.filter(model__name="fraud")
                   .values_list("name", "version__number"))
    if role in WRITERS:
        assert r.status_code == removed.status_code == 302
        assert aliases == {"canary": 2}
        assert AuditEvent.objects.filter(action="alias.remove", actor_name=role).exists()
    else:
        assert r.status_code == removed.status_code == 403
        assert aliases == {"prod": 1}


@pytest.mark.parametrize("role", ROLES)
def test_deploy_as_stable_needs_engineer_and_goes_through_the_service(page_client, catalog,
                                                                      role):
    client = page_client(role)
    r = client.post("/models/fraud/deploy/", {"version": 2}, follow=True)
    endpoint = Endpoint.objects.filter(model__name="fraud").first()
    if role in WRITERS:
        assert r.status_code == 200
        assert "Version 2 is now stable" in r.content.decode()
        assert endpoint.stable.number == 2
        assert AuditEvent.objects.filter(action="endpoint.deploy", actor_name=role).exists()
        # already stable: the service refuses, the page says why
        again = client.post("/models/fraud/deploy/", {"version": 2}, follow=True)
        assert "already stable" in again.content.decode()
    else:
        assert r.status_code == 403
        assert endpoint is None or endpoint.stable is None


def test_deploy_of_a_failed_version_is_refused_with_the_reason(page_client, catalog):
    model = RegisteredModel.objects.get(name="fraud")
    ModelVersion.objects.create(model=model, number=3, sha256="f" * 64, size_bytes=3,
                                status="failed", failure_reason="not an ONNX model")
    r = page_client("engineer").post("/models/fraud/deploy/", {"version": 3}, follow=True)
    assert "is failed, not ready: it cannot become stable — not an ONNX model" in (
        r.content.decode())


@pytest.mark.parametrize("role", ROLES)
def test_audit_log_is_for_admins_only(page_client, catalog, role):
    client = page_client(role)
    page, csv = client.get("/audit/"), client.get("/audit/export.csv")
    if role == "admin":
        assert page.status_code == csv.status_code == 200
    else:
        assert page.status_code == csv.status_code == 403


def test_audit_filters_and_csv_export_use_the_same_filters(page_client, catalog):
    client = page_client("admin")
    html = client.get("/audit/?model=fraud&action=alias.").content.decode()
    assert "alias.set" in html and "model.create" not in html
    r = client.get("/audit/export.csv?model=fraud&action=alias.")
    assert r["Content-Type"] == "text/csv" and r.streaming
    lines = b"".join(r.streaming_content).decode().strip().splitlines()
    assert lines[0].startswith("created_at,actor_name,action")
    assert len(lines) == 2 and ",alias.set," in lines[1]
    everything = b"".join(client.get("/audit/export.csv").streaming_content).decode()
    assert len(everything.strip().splitlines()) == AuditEvent.objects.count() + 1
    assert client.get("/audit/?since=not-a-date").status_code == 400
    partial = client.get("/audit/?actor=test", HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in partial and 'id="audit-table"' in partial


def test_model_list_filters_and_htmx_renders_only_the_table(page_client, catalog):
    client = page_client("viewer")
    html = client.get("/models/?search=fraud").content.decode()
    assert "/models/fraud/" in html and "/models/legacy/" not in html
    assert "/models/legacy/" in client.get("/models/?tag=old").content.decode()
    active = client.get("/models/?archived=false").content.decode()
    assert "/models/fraud/" in active and "/models/legacy/" not in active
    partial = client.get("/models/?search=fra", HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in partial and 'id="model-table"' in partial
    assert "v2" in partial and "ready" in partial  # latest version and its status, in words


def test_model_list_row_shows_stable_and_candidate(page_client, catalog):
    endpoint, _ = Endpoint.objects.get_or_create(model=RegisteredModel.objects.get(name="fraud"))
    versions = {v.number: v for v in ModelVersion.objects.filter(model__name="fraud")}
    endpoint.stable, endpoint.candidate, endpoint.candidate_weight = versions[1], versions[2], 10
    endpoint.save()
    html = page_client("viewer").get("/models/?search=fraud").content.decode()
    assert "v1" in html and "v2 at 10%" in html


def test_versions_partial_polls_only_while_a_version_is_validating(page_client, catalog):
    client = page_client("viewer")
    assert 'hx-trigger="every 1s"' not in client.get("/models/fraud/versions/").content.decode()
    model = RegisteredModel.objects.get(name="fraud")
    ModelVersion.objects.create(model=model, number=3, sha256="e" * 64, size_bytes=3,
                                status="validating")
    html = client.get("/models/fraud/versions/").content.decode()
    assert 'hx-trigger="every 1s"' in html and "validating" in html
    assert "<html" not in html


def test_version_page_shows_signature_report_and_try_it_prefilled(page_client, catalog):
    html = page_client("viewer").get("/models/fraud/versions/1/").content.decode()
    assert "CPUExecutionProvider" in html and "Warm-up" in html
    assert 'data-infer-url="/v2/models/fraud/versions/1/infer"' in html
    assert 'value="1,64"' in html  # dynamic batch -> 1
    assert "curl -sS -X POST" in html and "InferenceServerClient" in html
    assert "httpclient.InferInput(&#x27;x&#x27;, [1, 64], &#x27;FP32&#x27;)" in html


def test_diff_shows_signature_and_metadata_side_by_side(page_client, catalog):
    r = page_client("viewer").get("/models/fraud/diff/?a=1&b=2", HTTP_HX_REQUEST="true")
    html = r.content.decode()
    assert "<html" not in html
    assert "FP32[N×10]" in html and "FP32[N×2]" in html and "changed" in html
    assert page_client("viewer").get("/models/fraud/diff/?a=1").status_code == 400


def test_unknown_model_and_version_are_404(page_client, catalog):
    client = page_client("viewer")
    assert client.get("/models/nope/").status_code == 404
    assert client.get("/models/fraud/versions/9/").status_code == 404


def test_health_bar_says_each_state_in_words(page_client, catalog):
    from datetime import timedelta

    from django.utils import timezone

    from registry.models import ReplicaHeartbeat

    client = page_client("viewer")
    html = client.get("/models/").content.decode()
    assert "Database: <strong>ok</strong>" in html
    assert "Serving: <strong>degraded</strong>" in html and "no replicas reporting" in html
    now = timezone.now()
    ReplicaHeartbeat.objects.create(replica="r1", revision=10**6, started_at=now, last_seen=now)
    ReplicaHeartbeat.objects.create(replica="old", revision=0, started_at=now,
                                    last_seen=now - timedelta(hours=1))
    html = client.get("/models/").content.decode()
    # A replica silent for an hour is lost, not forgotten: degraded until someone removes it.
    assert "Serving: <strong>degraded</strong>" in html and "1 lost: old, silent since" in html
    ReplicaHeartbeat.objects.filter(replica="old").delete()
    html = client.get("/models/").content.decode()
    assert "Serving: <strong>ok</strong>" in html and "1/1 replicas at revision" in html


def test_django_admin_lists_tokens_and_read_only_audit(client, users):
    from django.contrib.auth.models import User

    User.objects.create_superuser("root", password="root-password-1")
    client.login(username="root", password="root-password-1")
    assert client.get("/admin/registry/apitoken/").status_code == 200
    assert client.get("/admin/registry/auditevent/").status_code == 200
    assert client.get("/admin/registry/auditevent/add/").status_code == 403
