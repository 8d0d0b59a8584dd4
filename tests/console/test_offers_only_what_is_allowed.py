"""The console offers only what is allowed (issue 24, items 8 and 10): "Deploy as stable" only on
versions the routing gate admits, the alias picker saying which versions production refuses,
approval words only where the model requires approval, the load test's refusal in the form's
terms, opsets readable, and a new deployment's first minutes on the 24 h and 7 d charts."""

from __future__ import annotations

import hashlib
import re
import time
import types
from datetime import UTC, datetime
from html import unescape

import onnx
import pytest
from django.contrib.auth.models import Group, User

from console.templatetags.console import opsets
from console.views import deployment as deployment_views
from registry import metrics, metrics_retention, samples, services
from registry.audit import Actor
from registry.models import MetricSample, ModelVersion, VersionStatus
from registry.signatures import extract_signature
from serving.core.stats import LATENCY_BUCKETS_S

pytestmark = pytest.mark.django_db(transaction=True)

WRITERS = ("engineer", "admin")
GATED, PLAIN = "fraud", "plain"
STATES = {1: "approved", 2: "pending", 3: "rejected", 4: "approved"}  # fraud: v1 is stable


def add_versions(model, count: int, by: User) -> None:
    """Ready versions as validation leaves them (signature with opsets), without validating."""
    for number in range(1, count + 1):
        blob = samples.mlp(seed=number)
        ModelVersion.objects.create(
            model=model, number=number, sha256=hashlib.sha256(blob).hexdigest(),
            size_bytes=len(blob), status=VersionStatus.READY, created_by=by,
            signature=extract_signature(onnx.load_from_string(blob)))


@pytest.fixture
def models(users):
    """fraud requires approval: v1 approved and stable, v2 pending, v3 rejected, v4 approved;
    plain does not: v1 stable, v2 ready. Alice uploaded them all, so engineer and admin may
    decide."""
    alice = User.objects.create_user(username="alice", password="alice-password-1")
    alice.groups.add(Group.objects.get(name="engineer"))
    uploader, reviewer = Actor(user=alice, name="alice"), Actor(user=users["engineer"],
                                                                name="engineer")
    gated = services.model_create(name=GATED, actor=uploader)
    add_versions(gated, 4, alice)
    for number in (1, 4):
        services.version_approve(model_name=GATED, number=number, actor=reviewer)
    services.version_reject(model_name=GATED, number=3, actor=reviewer, comment="AUC dropped")
    services.model_update(name=GATED, requires_approval=True, actor=uploader)
    services.endpoint_deploy(model_name=GATED, version_number=1, actor=uploader)
    plain = services.model_create(name=PLAIN, actor=uploader)
    add_versions(plain, 2, users["engineer"])
    services.endpoint_deploy(model_name=PLAIN, version_number=1, actor=uploader)
    return users


def row(html: str, number: int) -> str:
    return html.split(f'<tr id="version-{number}"', 1)[1].split("</tr>", 1)[0]


def alias_picker(html: str) -> dict[str, str]:
    picker = html.split('id="id_alias_version"', 1)[1].split("</select>", 1)[0]
    return dict(re.findall(r'<option value="(\d+)">([^<]*)</option>', picker))


def text(page: str) -> str:
    """What a reader sees: the body (or a part's, from its first whole tag on) without tags,
    scripts or attributes."""
    body = page.split("<body", 1)[1] if "<body" in page else page.split(">", 1)[1]
    body = re.sub(r"<script.*?</script>", "", body, flags=re.S)
    return unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body)))


# ------------------------------------------------------------- deploy buttons and pickers

@pytest.mark.parametrize("role", WRITERS)
def test_deploy_as_stable_is_offered_only_on_versions_the_gate_admits(page_client, models, role):
    html = page_client(role).get(f"/models/{GATED}/").content.decode()
    assert "Deploy as stable" in row(html, 4)  # approved, not stable
    for number in (1, 2, 3):  # stable; pending; rejected
        assert "Deploy as stable" not in row(html, number), number
    assert f'href="/models/{GATED}/versions/2/#approval">approve</a> to deploy' in row(html, 2)
    assert "rejected: not deployable" in row(html, 3)
    for number, state in STATES.items():
        assert f'data-approval="{state}"' in row(html, number)


def test_viewers_get_no_deploy_button_and_no_hint_to_act(page_client, models):
    html = page_client("viewer").get(f"/models/{GATED}/").content.decode()
    assert "Deploy as stable" not in html and "to deploy" not in html
    assert 'id="id_alias_version"' not in html


@pytest.mark.parametrize("url", [f"/models/{GATED}/", f"/models/{GATED}/versions/"])
def test_alias_picker_says_which_versions_production_refuses(page_client, models, url):
    """Any ready version may carry an alias (alias_set); only the production alias is gated,
    so the versions it refuses are offered with the reason, in the page and in its poll."""
    html = page_client("engineer").get(url).content.decode()
    assert alias_picker(html) == {"4": "v4", "3": "v3 (rejected: not for production)",
                                  "2": "v2 (pending approval: not for production)", "1": "v1"}


def test_alias_picker_of_a_model_without_approval_is_plain(page_client, models):
    html = page_client("engineer").get(f"/models/{PLAIN}/").content.decode()
    assert alias_picker(html) == {"2": "v2", "1": "v1"}
    assert "only an approved one" not in html


@pytest.mark.parametrize(("number", "says"), [
    (4, "Not serving: this is not the stable version of fraud (deploy it from the model page)."),
    (2, "Not serving: this is not the stable version of fraud; it is pending approval, so it "
        "cannot be deployed until approved."),
    (3, "Not serving: this is not the stable version of fraud; it is rejected, so it cannot "
        "be deployed."),
])
def test_version_page_offers_deploying_only_what_the_gate_admits(page_client, models, number,
                                                                 says):
    html = page_client("engineer").get(f"/models/{GATED}/versions/{number}/").content.decode()
    role = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html.split('id="version-role"', 1)[1]
                                      .split("</p>", 1)[0].split(">", 1)[1]))
    assert role.startswith(says), role
    assert ("model page" in role) == (number == 4)


@pytest.mark.parametrize(("number", "disabled"), [(2, None), (3, "Reject"), (4, "Approve")])
def test_version_page_of_a_gated_model_shows_its_approval_and_the_decision_form(
        page_client, models, number, disabled):
    html = page_client("engineer").get(f"/models/{GATED}/versions/{number}/").content.decode()
    heading = html.split("<h1>", 1)[1].split("</h1>", 1)[0]
    assert f"badge-approval-{STATES[number]}" in heading
    approval = html.split('id="approval"', 1)[1].split("</section>", 1)[0]
    assert "fraud requires approval before promotion" in approval
    for button in ("Approve", "Reject"):
        found = re.search(rf'<button [^>]*value="{button.lower()}"[^>]*>', approval)[0]
        assert ("disabled" in found) == (button == disabled), (button, found)


# ------------------------------------------------------------------- approval words

@pytest.mark.parametrize("role", ["viewer", *WRITERS])
def test_a_model_without_approval_says_nothing_of_approval(page_client, models, role):
    client = page_client(role)
    model_page = client.get(f"/models/{PLAIN}/").content.decode()
    versions = model_page.split('id="versions"', 1)[1]
    assert "data-approval" not in versions and "badge-approval" not in versions
    assert "Approval</th>" not in versions and "pending" not in text(versions)
    assert ("Deploy as stable" in row(model_page, 2)) == (role in WRITERS)
    assert "Any ready version can be promoted." in model_page  # the setting still offered
    for number in (1, 2):
        page = client.get(f"/models/{PLAIN}/versions/{number}/").content.decode()
        seen = text(page)
        assert 'id="approval"' not in page and "badge-approval" not in page
        for words in ("pending", "approve", "another engineer", "Approval"):
            assert words not in seen, (number, words)


# ------------------------------------------------------------------ opsets, load tests

def test_opsets_read_as_domain_names_and_versions():
    assert opsets({"": 17}) == "ai.onnx 17"
    assert opsets({"com.microsoft": 1, "ai.onnx.ml": 3, "": 13}) == (
        "ai.onnx 13, com.microsoft 1, ai.onnx.ml 3")
    assert opsets({}) == "—" and opsets(None) == "—"


def test_version_page_shows_opsets_readably(page_client, models):
    html = page_client("viewer").get(f"/models/{PLAIN}/versions/1/").content.decode()
    found = re.search(r"opsets ([^·]+) ·", html)[1].strip()
    assert re.fullmatch(r"ai\.onnx \d+", found), found
    assert "{&quot;&quot;" not in html and '{"": ' not in html


def test_load_test_refusal_says_tick_the_confirm_box(page_client, models):
    r = page_client("engineer").post(f"/models/{PLAIN}/versions/1/loadtest/",
                                     {"requests": 10, "concurrency": 1}, follow=True)
    said = text(r.content.decode())
    assert ("v1 takes real traffic (stable of plain): a load test would slow its users down. "
            "Tick “It takes real traffic: run anyway” to run it anyway.") in said
    assert "confirm=true" not in said


def test_load_test_refusal_on_a_protected_endpoint_names_the_key_field(page_client, models):
    services.endpoint_protect(model_name=PLAIN, actor=Actor.system("test"))
    r = page_client("engineer").post(f"/models/{PLAIN}/versions/1/loadtest/",
                                     {"requests": 10, "concurrency": 1, "confirm": "on"},
                                     follow=True)
    said = text(r.content.decode())
    assert ("plain's endpoint requires a predict key: fill in “Predict key” (used for this run "
            "only, never stored).") in said
    assert "`key`" not in said


# ------------------------------------------------------------------------ charts

@pytest.fixture
def clock(monkeypatch) -> int:
    """Wall-clock seconds as the metric queries and the chart view read them, held still 10 s
    before a 10-minute boundary: a deployment of the last few minutes has no finished period."""
    now = int(time.time()) // 600 * 600 - 10
    held = types.SimpleNamespace(time=lambda: now + 0.5, monotonic=time.monotonic)
    monkeypatch.setattr(deployment_views, "time", held)
    monkeypatch.setattr(metrics, "time", held)
    return now


def a_new_deployment_served(now: int, *, minutes: int, rps: int = 20) -> None:
    """Heartbeat samples (every 2 s, tests' buckets are 1 s) of v1 of plain for its first
    minutes, then compaction as the worker runs it each minute (it marks finished periods)."""
    hist = [0] * (len(LATENCY_BUCKETS_S) + 1)
    start = now - minutes * 60
    for i, bucket in enumerate(range(start + 2, now + 1, 2), 1):
        hist[5] = rps * 2 * i
        MetricSample.objects.create(
            replica="r1", model_name=PLAIN, version=1, bucket=bucket,
            at=datetime.fromtimestamp(bucket, tz=UTC), count=rps * 2 * i, errors=0,
            latency_buckets=list(hist), counting_since=datetime.fromtimestamp(start, tz=UTC))
    metrics_retention.forget_progress()
    metrics_retention.compact(now=now)
    metrics_retention.forget_progress()


@pytest.mark.parametrize("minutes", [3, 14])
@pytest.mark.parametrize("picked", ["24h", "7d", "6h", "1h"])
def test_a_new_deployments_first_minutes_show_at_every_range(page_client, models, clock,
                                                             picked, minutes):
    a_new_deployment_served(clock, minutes=minutes)
    html = page_client("viewer").get(
        f"/models/{PLAIN}/deployment/charts/?range={picked}").content.decode()
    rps = html[html.index('id="chart-rps"'):html.index('id="chart-error-rate"')]
    assert "no requests in this window" not in rps
    assert not re.search(r'data-label="v1 stable" data-points="0"', rps)
    latest = float(re.search(r'v1 stable:</span> <strong class="latest">([\d.]+)', rps)[1])
    assert latest == pytest.approx(20, rel=0.05)


def test_a_coarse_series_counts_the_unmarked_period_once(models, clock):
    """The 10-minute tier read with the finer samples of the periods compaction has not marked
    yet: every request counted once, whatever the tier."""
    a_new_deployment_served(clock, minutes=25)
    window = 3600
    totals = {level: sum(p["count"] for p in metrics.version_series(
        PLAIN, 1, seconds=window, level=level, step=metrics.point_seconds(level)))
        for level in (0, 1, 2)}
    assert totals[0] == totals[1] == totals[2] == 20 * 25 * 60
