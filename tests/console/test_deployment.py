"""The deployment page: every role sees the rollout state, only engineers and admins get the
buttons, every button goes through a registry rollout service (audited, its refusal shown), the
charts draw real metric samples as SVG, and replicas' convergence is shown per replica."""

from __future__ import annotations

import re
import time
import types
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from console.views import deployment as deployment_views
from registry import metrics, samples, services
from registry.audit import Actor
from registry.models import AuditEvent, Endpoint, MetricSample, ReplicaHeartbeat
from registry.notify import current_revision
from serving.core.stats import LATENCY_BUCKETS_S

pytestmark = pytest.mark.django_db(transaction=True)

ROLES = ["viewer", "engineer", "admin"]
WRITERS = {"engineer", "admin"}
PAGE = "/models/fraud/deployment/"
OPS = ["canary", "weight", "promote", "abort", "pause", "resume", "rollback", "bg-deploy",
       "switch", "switch-back", "bg-finish", "shadow-start", "shadow-stop"]


@pytest.fixture
def deployed(catalog, ready_model):
    """fraud: v1 stable, v2 ready but with another output shape, v3 ready and compatible."""
    ready_model("fraud", samples.mlp(seed=2))
    services.endpoint_deploy(model_name="fraud", version_number=1, actor=Actor.system("test"))
    return "fraud"


def messages_of(response) -> str:
    html = response.content.decode()
    found = re.search(r'<ul class="messages".*?</ul>', html, re.S)
    return re.sub(r"<[^>]+>", "", found.group(0)) if found else ""


def endpoint() -> Endpoint:
    return Endpoint.objects.select_related("stable", "candidate").get(model__name="fraud")


@pytest.mark.parametrize("role", ROLES)
def test_every_role_sees_the_state_but_only_writers_get_the_buttons(page_client, deployed, role):
    r = page_client(role).get(PAGE)
    assert r.status_code == 200
    html = r.content.decode()
    assert 'data-state="stable"' in html and "Version 1 (stable): <strong>100 %</strong>" in html
    assert "Metrics per version" in html and "Replica convergence" in html
    buttons = ["Start canary", "no ready version older than", "Blue-green deploy", "Start shadow",
               'type="range"', "/models/fraud/deployment/canary/"]
    for marker in buttons:
        assert (marker in html) == (role in WRITERS), (role, marker)
    if role not in WRITERS:
        assert "needs the engineer role" in html
        assert 'method="post" action="/models/fraud/deployment/' not in html


def test_the_model_page_and_the_models_list_link_the_deployment_page(page_client, deployed):
    client = page_client("viewer")
    assert PAGE in client.get("/models/fraud/").content.decode()
    assert PAGE in client.get("/models/").content.decode()


@pytest.mark.parametrize("op", OPS)
def test_viewers_are_refused_every_rollout_post(page_client, deployed, op):
    before = AuditEvent.objects.count()
    r = page_client("viewer").post(f"{PAGE}{op}/", {"version": 3, "weight": 50})
    assert r.status_code == 403
    assert AuditEvent.objects.count() == before
    assert endpoint().candidate is None and endpoint().stable.number == 1


def test_anonymous_users_go_to_login_and_unknown_actions_are_404(page_client, deployed):
    assert page_client(None).get(PAGE).status_code == 302
    assert page_client(None).post(f"{PAGE}canary/").status_code == 302
    assert page_client("engineer").post(f"{PAGE}explode/").status_code == 404
    assert page_client("viewer").get("/models/nope/deployment/").status_code == 404


def test_canary_weight_promote_and_rollback_go_through_the_services(page_client, deployed):
    client = page_client("engineer")
    r = client.post(f"{PAGE}canary/", {"version": 3, "weight": 10, "reason": "try v3"},
                    follow=True)
    assert "Canary started: version 3 is the candidate." in messages_of(r)
    ep = endpoint()
    assert (ep.stable.number, ep.candidate.number, ep.candidate_weight) == (1, 3, 10)
    html = r.content.decode()
    assert 'data-state="canary"' in html and "Set weight" in html and "Promote v3" in html
    assert "Start canary" not in html  # the state machine does not allow a second canary

    r = client.post(f"{PAGE}weight/", {"weight": 35}, follow=True)
    assert "The candidate now takes 35 % of traffic." in messages_of(r)
    assert endpoint().candidate_weight == 35
    assert "Version 3 (candidate): <strong>35 %</strong>" in r.content.decode()

    r = client.post(f"{PAGE}promote/", {"reason": "looks good"}, follow=True)
    assert "Candidate promoted" in messages_of(r)
    assert endpoint().stable.number == 3 and endpoint().candidate is None

    r = client.post(f"{PAGE}rollback/", {"version": 1, "reason": "regression"}, follow=True)
    assert "Rolled back: version 1 is the stable version now." in messages_of(r)
    assert endpoint().stable.number == 1
    actions = list(AuditEvent.objects.filter(model_name="fraud", actor_name="engineer")
                   .order_by("id").values_list("action", flat=True))
    assert actions[-4:] == ["endpoint.canary", "endpoint.weight", "endpoint.promote",
                            "endpoint.rollback"]
    rollback = AuditEvent.objects.filter(action="endpoint.rollback").latest("id")
    assert rollback.reason == "regression" and rollback.before["stable"] == 3
    # The decisions panel shows it, with who and why.
    html = r.content.decode()
    decisions = html[html.index('id="decisions"'):]
    assert "endpoint.rollback" in decisions and "regression" in decisions


def test_service_refusals_are_shown_as_messages(page_client, deployed):
    client = page_client("engineer")
    r = client.post(f"{PAGE}canary/", {"version": 2, "weight": 10}, follow=True)
    assert "signature is incompatible" in messages_of(r)
    assert endpoint().candidate is None
    r = client.post(f"{PAGE}weight/", {"weight": 20}, follow=True)
    assert "Error:" in messages_of(r) and endpoint().candidate_weight == 0
    assert AuditEvent.objects.filter(action="endpoint.weight.refused").exists()
    r = client.post(f"{PAGE}canary/", {"version": 3, "weight": 101}, follow=True)
    assert "weight" in messages_of(r) and endpoint().candidate is None
    r = client.post(f"{PAGE}canary/", {"version": 3, "weight": 0, "automated": "on",
                                       "steps": "50, 20"}, follow=True)
    assert "plan.steps must be increasing" in messages_of(r)


def test_abort_sends_all_traffic_back_to_stable(page_client, deployed):
    client = page_client("admin")
    client.post(f"{PAGE}canary/", {"version": 3, "weight": 50})
    r = client.post(f"{PAGE}abort/", {"reason": "latency"}, follow=True)
    assert "Canary aborted" in messages_of(r)
    assert endpoint().candidate is None and endpoint().stable.number == 1


@pytest.mark.usefixtures("analysis_ticking")
def test_automated_canary_shows_its_plan_and_can_be_paused(page_client, deployed):
    client = page_client("engineer")
    r = client.post(f"{PAGE}canary/", {"version": 3, "weight": 0, "automated": "on",
                                       "steps": "5, 25, 100", "bake_seconds": 30}, follow=True)
    assert "Canary started" in messages_of(r), messages_of(r)
    ep = endpoint()
    assert ep.candidate_weight == 5 and ep.rollout.analysis.plan.steps == (5, 25, 100)
    html = r.content.decode()
    assert 'data-state="analysing"' in html
    panel = html[html.index('id="analysis"'):]
    assert "Step 1 of 3" in panel and 'aria-current="step"' in panel
    assert "judged after 100 candidate requests" in panel and "plan: 5 → 25 → 100 %" in panel
    assert "Pause analysis" in html
    r = client.post(f"{PAGE}pause/", follow=True)
    assert "paused" in messages_of(r) and 'data-state="canary"' in r.content.decode()
    assert "Resume analysis" in r.content.decode()
    r = client.post(f"{PAGE}resume/", follow=True)
    assert 'data-state="analysing"' in r.content.decode()


@pytest.mark.usefixtures("analysis_ticking")
def test_analysis_decisions_are_listed_with_their_figures(page_client, deployed):
    services.canary_start(model_name="fraud", version_number=3, actor=Actor.system("test"),
                          plan={"steps": [10, 100], "bake_seconds": 0, "min_requests": 10})
    figures = {"candidate": {"count": 120, "errors": 12, "error_rate": 0.1, "p99_ms": 4.5},
               "stable": {"count": 900, "errors": 0, "error_rate": 0.0, "p99_ms": 3.0}}
    services.canary_abort(model_name="fraud", actor=Actor.system("canary-analysis"),
                          reason="automatic rollback: candidate error rate 10.00 % > 1.00 %",
                          details=figures)
    html = page_client("viewer").get("/models/fraud/deployment/live/").content.decode()
    panel = html[html.index('id="decisions"'):]
    assert "canary-analysis" in panel and "automatic rollback" in panel
    assert "candidate: 120 req, 10 % errors, p99 4.5 ms" in panel
    assert "stable: 900 req, 0 % errors, p99 3.0 ms" in panel


def test_blue_green_deploy_switch_refusal_and_finish(page_client, deployed):
    client = page_client("engineer")
    r = client.post(f"{PAGE}bg-deploy/", {"version": 3}, follow=True)
    assert "deployed to the idle colour" in messages_of(r)
    ep = endpoint()
    assert ep.live_color == "blue" and ep.green.number == 3
    html = r.content.decode()
    assert 'data-state="blue-green"' in html and ">Switch</button>" in html
    # No replica has loaded green: the service refuses and says which replica lags.
    ReplicaHeartbeat.objects.create(replica="r1", revision=current_revision(), versions={},
                                    started_at=timezone.now(), last_seen=timezone.now())
    r = client.post(f"{PAGE}switch/", follow=True)
    assert "not loaded and warmed on every live replica: r1 (not loaded)" in messages_of(r)
    ReplicaHeartbeat.objects.filter(replica="r1").update(
        versions={"fraud:1": {"state": "READY", "queue_depth": 0},
                  "fraud:3": {"state": "READY", "queue_depth": 0}})
    r = client.post(f"{PAGE}switch/", follow=True)
    assert "Switched" in messages_of(r) and endpoint().live_color == "green"
    assert "Switch back" in r.content.decode()
    r = client.post(f"{PAGE}switch-back/", follow=True)
    assert "Switched back" in messages_of(r) and endpoint().live_color == "blue"
    r = client.post(f"{PAGE}bg-finish/", follow=True)
    assert "Blue-green finished" in messages_of(r) and endpoint().live_color == ""


def test_shadow_start_and_stop(page_client, deployed):
    client = page_client("engineer")
    r = client.post(f"{PAGE}shadow-start/", {"version": 3}, follow=True)
    assert "receives a shadow copy" in messages_of(r) and endpoint().shadow.number == 3
    assert "Shadow: version 3 receives a copy of live traffic" in r.content.decode()
    html = client.get(f"{PAGE}charts/").content.decode()
    assert "Shadow comparison: version 3" in html and "No comparison reported yet" in html
    bucket = int(time.time())
    MetricSample.objects.create(
        replica="r1", model_name="fraud", version=3, bucket=bucket, at=timezone.now(),
        shadow={"version": "3", "requests": 40, "errors": 1, "mean_latency_us": 812.0,
                "max_abs_diff": 0.03125, "argmax_agreement": 0.975, "compared_rows": 40,
                "last_error": None})
    html = client.get(f"{PAGE}charts/").content.decode()
    assert "40 (1 error)" in html and "97.5 % of rows agree" in html and "812 µs" in html
    r = client.post(f"{PAGE}shadow-stop/", follow=True)
    assert "Shadow stopped." in messages_of(r) and endpoint().shadow is None


@pytest.fixture
def frozen_second(monkeypatch) -> int:
    """Wall-clock seconds as the metric queries and the chart view read them, held still in the
    middle of one second, so samples written 'up to now' and the page drawn 'now' agree on
    which bucket is still filling however slow the machine is."""
    now = int(time.time())
    clock = types.SimpleNamespace(time=lambda: now + 0.5, monotonic=time.monotonic)
    monkeypatch.setattr(deployment_views, "time", clock)
    monkeypatch.setattr(metrics, "time", clock)
    return now


def _samples(version: int, *, now: int, replica: str, rps: int, errors_every: int,
             fast_bucket: int, buckets: int = 12) -> None:
    """Cumulative samples one bucket (1 s in tests) apart, as a replica's heartbeats write; each
    written `at` its own bucket's second, whatever time writing them takes on a slow machine
    (rates divide by the time between samples)."""
    count = errors = 0
    hist = [0] * (len(LATENCY_BUCKETS_S) + 1)
    for i in range(buckets):
        bucket = now - buckets + i + 1
        count += rps
        errors += rps // errors_every
        hist[fast_bucket] += rps - rps // errors_every
        MetricSample.objects.create(
            replica=replica, model_name="fraud", version=version, bucket=bucket,
            at=datetime.fromtimestamp(bucket, tz=UTC), count=count, errors=errors,
            latency_buckets=list(hist))


def test_chart_partial_draws_real_metric_samples_as_svg(page_client, deployed, frozen_second):
    services.canary_start(model_name="fraud", version_number=3, weight=20,
                          actor=Actor.system("test"))
    now = frozen_second
    _samples(1, now=now, replica="r1", rps=40, errors_every=40, fast_bucket=5)
    _samples(1, now=now, replica="r2", rps=40, errors_every=40, fast_bucket=5)
    _samples(3, now=now, replica="r1", rps=20, errors_every=5, fast_bucket=12)
    r = page_client("viewer").get(f"{PAGE}charts/", HTTP_HX_REQUEST="true")
    assert r.status_code == 200
    html = r.content.decode()
    assert html.startswith('<div id="charts"') and 'hx-trigger="every 2s"' in html
    assert "<html" not in html  # a partial, swapped in place
    figures = re.findall(r'<figure class="chart" id="(chart-[\w-]+)"', html)
    assert figures == ["chart-rps", "chart-error-rate", "chart-p50-ms", "chart-p95-ms",
                       "chart-p99-ms"]
    rps = html[html.index('id="chart-rps"'):html.index('id="chart-error-rate"')]
    # 12 samples per replica: the replicas started inside the window, so the first counts from
    # zero; the newest bucket is still filling (not drawn): 11 points per version.
    assert 'data-label="v1 stable" data-points="11"' in rps
    assert 'data-label="v3 candidate" data-points="11"' in rps
    points = re.findall(r'<polyline points="([^"]+)"', rps)
    assert len(points) == 2 and all(len(p.split()) == 11 for p in points)
    assert 'stroke-dasharray="7 4"' in rps  # the candidate differs by dash, not only colour
    # Legend in words with the latest figures: both replicas summed for v1.
    assert "<span>v1 stable:</span> <strong class=\"latest\">80</strong>" in rps
    assert "<span>v3 candidate:</span> <strong class=\"latest\">20</strong>" in rps
    assert "Latest: v1 stable: 80 req/s; v3 candidate: 20 req/s" in rps
    errors = html[html.index('id="chart-error-rate"'):html.index('id="chart-p50-ms"')]
    assert "v1 stable:</span> <strong class=\"latest\">2.5</strong>" in errors
    assert "v3 candidate:</span> <strong class=\"latest\">20</strong>" in errors
    p99 = html[html.index('id="chart-p99-ms"'):]
    v1_p99 = float(re.search(r'v1 stable:</span> <strong class="latest">([\d.]+)', p99)[1])
    v3_p99 = float(re.search(r'v3 candidate:</span> <strong class="latest">([\d.]+)', p99)[1])
    assert v3_p99 > v1_p99 > 0


@pytest.mark.django_db
def test_series_baseline_is_the_newest_sample_before_the_window_even_across_gaps(
        frozen_second):
    """A replica up for an hour whose heartbeats skipped buckets: its first point in the window
    is the difference from its last sample before, not its lifetime total."""
    now, hist = frozen_second, [0] * (len(LATENCY_BUCKETS_S) + 1)

    def sample(bucket: int, count: int) -> None:
        MetricSample.objects.create(replica="r1", model_name="fraud", version=1, bucket=bucket,
                                    at=timezone.now(), count=count, errors=0,
                                    latency_buckets=[count] + hist[1:])

    sample(now - 3600, 100_000)
    sample(now - 130, 250_000)  # last before a 120 s window, 10 buckets before its start
    sample(now - 100, 250_300)
    sample(now - 50, 250_800)
    points = metrics.version_series("fraud", 1, seconds=120)
    assert [(p["t"], p["count"]) for p in points] == [(now - 100, 300), (now - 50, 500)]


def test_charts_say_when_there_is_no_traffic(page_client, deployed):
    html = page_client("viewer").get(f"{PAGE}charts/").content.decode()
    assert html.count("no requests in this window") == 5
    assert 'data-label="v1 stable" data-points="0"' in html


def test_replica_table_shows_convergence_per_replica(page_client, deployed):
    revision = current_revision()
    now = timezone.now()
    ReplicaHeartbeat.objects.create(
        replica="r1", revision=revision, address="10.0.0.1:8000", started_at=now, last_seen=now,
        versions={"fraud:1": {"state": "READY", "queue_depth": 3,
                              "providers": ["CPUExecutionProvider"]},
                  "other:1": {"state": "READY", "queue_depth": 50}})
    ReplicaHeartbeat.objects.create(
        replica="r2", revision=revision, started_at=now, last_seen=now - timedelta(seconds=1),
        versions={"fraud:1": {"state": "READY", "queue_depth": 1},
                  "fraud:3": {"state": "FAILED", "reason": "warm-up failed: bad input"}})
    ReplicaHeartbeat.objects.create(
        replica="r3", revision=revision - 1, started_at=now, last_seen=now,
        degraded="cannot reach the route source", versions={"fraud:1": {"state": "LOADING"}})
    ReplicaHeartbeat.objects.create(
        replica="r4", revision=revision, started_at=now, versions={},
        last_seen=now - timedelta(seconds=60))
    r = page_client("viewer").get(f"{PAGE}live/?rev=0", HTTP_HX_REQUEST="true")
    html = r.content.decode()
    assert html.startswith('<div id="split"')
    assert 'id="replicas" aria-labelledby="replicas-h" hx-swap-oob="true"' in html
    assert f"2/3 replicas at revision {revision}" in html
    assert "1 lost" in html
    row = {name: html[html.index(f'data-replica="{name}"'):].split("</tr>")[0]
           for name in ("r1", "r2", "r3", "r4")}
    assert "current" in row["r1"] and "CPUExecutionProvider" in row["r1"]
    assert ">3</td>" in row["r1"] and "other" not in row["r1"]  # only this model's versions
    assert "warm-up failed: bad input" in row["r2"] and "failed" in row["r2"]
    assert "behind" in row["r3"] and "cannot reach the route source" in row["r3"]
    assert "loading" in row["r3"]
    assert 'class="lost"' in row["r4"] and ">lost</span>" in row["r4"]
    # its age as the page was drawn: 60 s and however long the drawing took on a busy machine
    age = float(re.search(r"([0-9.]+) s ago", row["r4"])[1])
    assert 60.0 <= age < 90.0, row["r4"]
    assert f"The endpoint changed (revision {endpoint().revision}" in html  # rev=0 is old


def test_controls_redraw_themselves_when_the_endpoint_changes_under_the_page(page_client,
                                                                             deployed):
    rev = endpoint().revision
    client = page_client("engineer")
    page = client.get(PAGE).content.decode()
    assert "endpoint changed" not in page and "Start canary" in page and ">Promote" not in page
    live = client.get(f"{PAGE}live/?rev={rev}").content.decode()
    assert "endpoint changed" not in live and 'id="controls"' not in live  # nothing to redraw
    services.canary_start(model_name="fraud", version_number=3, weight=5,
                          actor=Actor.system("canary-analysis"))
    live = client.get(f"{PAGE}live/?rev={rev}", HTTP_HX_REQUEST="true").content.decode()
    new = endpoint().revision
    assert f"The endpoint changed (revision {new}: endpoint.canary by canary-analysis)" in live
    assert "Version 3 (candidate): <strong>5 %</strong>" in live
    controls = live[live.index('<section class="card" id="controls"'):]
    assert controls.startswith(f'<section class="card" id="controls" aria-labelledby="controls-h"'
                               f' hx-swap-oob="true" data-revision="{new}">')
    assert ">Promote" in controls and "Start canary" not in controls  # the canary state's buttons
    assert f"live/?rev={new}" in live  # the next poll knows the page is current again
    later = client.get(f"{PAGE}live/?rev={new}").content.decode()
    assert "endpoint changed" not in later and 'id="controls"' not in later
    viewer = page_client("viewer").get(f"{PAGE}live/?rev={rev}").content.decode()
    assert "You can watch this rollout" in viewer and ">Promote" not in viewer


def test_not_deployed_model_shows_how_to_start(page_client, catalog):
    html = page_client("engineer").get(PAGE).content.decode()
    assert 'data-state="empty"' in html and "Nothing is deployed" in html
    assert "Start canary" not in html
    assert "no version is serving" in page_client("engineer").get(f"{PAGE}charts/").content.decode()
