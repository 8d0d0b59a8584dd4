"""deploy/monitoring as the real tools read it. promtool checks the alert rules and the example
config and runs their unit tests; the dashboard is what build.py builds with
grafana-foundation-sdk and has the deployment page's panels; the console's /healthz/metrics says
what only the registry knows; and a real Prometheus scraping two real replicas and the console
sees the error-rate and canary alerts fire on an injected error burst, a killed replica reported
lost, and answers every query of the dashboard with at least one series."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import threading
import time
from datetime import timedelta
from functools import partial
from pathlib import Path

import httpx
import pytest
import yaml
from django.db import OperationalError
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from onnx import TensorProto, helper
from prometheus_client.parser import text_string_to_metric_families

from registry import samples, selectors
from registry.audit import Actor
from registry.models import ReplicaHeartbeat
from registry.notify import current_revision
from registry.routing import Routing
from registry.services.replicas import credential_create
from tests.conftest import REPO
from tests.replicas import (
    ControlPlane,
    Replica,
    free_port,
    reported_in,
    stop_process,
    wait_answering,
)

MONITORING = REPO / "deploy" / "monitoring"
RULES = MONITORING / "alerts.yml"
RULE_TESTS = MONITORING / "alerts.test.yml"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "mmc-deployment.json"
BUILD = MONITORING / "grafana" / "build.py"
PROMTOOL, PROMETHEUS = shutil.which("promtool"), shutil.which("prometheus")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool missing: Debian's prometheus package is not installed")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus missing: Debian's prometheus package is not installed")


def alerting_rules() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def dashboard_targets() -> list[tuple[str, dict]]:
    """(panel title, target) for every query of the dashboard."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(p["title"], t) for p in panels for t in p.get("targets", ())]


def model_variable() -> tuple[str, str]:
    """(metric, label) of the dashboard's `model` variable, label_values(metric, label)."""
    variables = json.loads(DASHBOARD.read_text())["templating"]["list"]
    query = next(v["query"] for v in variables if v["name"] == "model")
    metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", query).groups()
    return metric, label


# -- promtool -----------------------------------------------------------------------------------

@needs_promtool
def test_promtool_accepts_the_alert_rules_and_the_example_config():
    for args in (["check", "rules", str(RULES)],
                 ["check", "config", str(MONITORING / "prometheus.yml")]):
        r = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_each_alert_fires_on_its_synthetic_series_and_stays_quiet_on_healthy_ones():
    r = subprocess.run([PROMTOOL, "test", "rules", str(RULE_TESTS)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_every_alert_has_a_severity_names_what_it_is_about_and_is_unit_tested():
    """Each alert's summary names the labels its alerts carry (model, version, replica...), and
    a unit test sees it fire."""
    fired: dict[str, set[str]] = {}
    for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for case in test.get("alert_rule_test", ()):
            for alert in case.get("exp_alerts") or ():
                fired.setdefault(case["alertname"], set()).update(alert["exp_labels"])
    for rule in alerting_rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert name in fired, f"{name} never fires in {RULE_TESTS.name}"
        for label in fired[name] - {"severity", "role", "reason"}:
            assert f"$labels.{label}" in rule["annotations"]["summary"], (name, label)
            assert f"$labels.{label}" in rule["annotations"]["description"], (name, label)


# -- the dashboard ------------------------------------------------------------------------------

def test_the_committed_dashboard_is_what_build_py_builds():
    pytest.importorskip("grafana_foundation_sdk", reason="grafana-foundation-sdk not installed")
    spec = importlib.util.spec_from_file_location("mmc_dashboard_build", BUILD)
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    assert DASHBOARD.read_text() == build.render(), f"run: python {BUILD.relative_to(REPO)}"


def test_the_dashboard_has_the_deployment_pages_charts_one_line_per_version_and_role():
    board = json.loads(DASHBOARD.read_text())
    titles = [p["title"] for p in board["panels"] if p["type"] == "timeseries"]
    assert titles[-5:] == ["Requests per second", "Error rate", "Latency p50", "Latency p95",
                           "Latency p99"]
    assert {p["title"] for p in board["panels"]} >= {"Traffic split", "Replicas"}
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    assert model_variable() == ("nv_inference_request_success", "model")
    for title, target in dashboard_targets():
        assert target["datasource"]["uid"] == "${datasource}", title
        assert target["refId"] and target["expr"], title
        if "nv_inference" in target["expr"] or "mmc_inference" in target["expr"]:
            assert '{model="$model"}' in target["expr"], title
            assert target["legendFormat"] == "v{{version}} {{role}}", title
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))


# -- the console's metrics ----------------------------------------------------------------------

def samples_of(text: str) -> dict[tuple[str, frozenset], float]:
    """{(name, labels): value} of a text exposition."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_routing_names_each_version_once_with_its_role_and_share():
    canary = Routing(stable=1, candidate=2, candidate_weight=10, shadow=3)
    assert canary.roles() == [("stable", 1, 90), ("candidate", 2, 10), ("shadow", 3, 0)]
    blue_green = Routing(stable=4, blue=4, green=5, live_color="blue", shadow=4)
    assert blue_green.roles() == [("blue", 4, 100), ("green", 5, 0)]


@pytest.mark.django_db
def test_the_console_says_which_replicas_are_lost_or_behind_and_each_versions_role(
        client, engineer, ready_model, django_assert_num_queries):
    ready_model("fraud", samples.mlp(seed=1))
    ready_model("fraud", samples.mlp(seed=2))
    E = "/api/v1/models/fraud/endpoint/"
    assert engineer.post(E + "deploy/", {"version": 1}, format="json").status_code == 200
    assert engineer.post(E + "canary/", {"version": 2, "weight": 10},
                         format="json").status_code == 200
    revision, now = current_revision(), timezone.now()
    ReplicaHeartbeat.objects.create(replica="at", revision=revision, started_at=now,
                                    last_seen=now)
    ReplicaHeartbeat.objects.create(replica="late", revision=revision - 1, started_at=now,
                                    last_seen=now, behind_since=now - timedelta(seconds=200))
    ReplicaHeartbeat.objects.create(replica="gone", revision=revision, started_at=now,
                                    last_seen=now - timedelta(minutes=5))
    with django_assert_num_queries(3):  # the revision, the replicas, the endpoints
        r = client.get("/healthz/metrics")  # no sign-in, as /healthz
    assert r.status_code == 200 and r["Content-Type"].startswith("text/plain; version=0.0.4")
    got = samples_of(r.content.decode())

    def value(name, **labels):
        return got[(name, frozenset(labels.items()))]

    assert value("mmc_desired_route_revision") == revision
    assert [value("mmc_replica_lost", replica=n) for n in ("at", "late", "gone")] == [0, 0, 1]
    assert value("mmc_replica_applied_revision", replica="late") == revision - 1
    assert value("mmc_replica_behind_seconds", replica="at") == 0
    assert 200 <= value("mmc_replica_behind_seconds", replica="late") < 260
    assert value("mmc_endpoint_revision", model="fraud") == revision
    assert value("mmc_endpoint_traffic_percent", model="fraud", version="1", role="stable") == 90
    assert value("mmc_endpoint_traffic_percent", model="fraud", version="2",
                 role="candidate") == 10
    assert value("mmc_version_max_queue_size", model="fraud", version="2") == 256


@pytest.mark.django_db
def test_the_console_fails_the_scrape_while_its_database_is_down(monkeypatch):
    """No half answer: Prometheus marks the scrape failed, MmcConsoleMetricsMissing follows."""
    def refuse(*args, **kwargs):
        raise OperationalError("connection refused")

    monkeypatch.setattr(selectors, "replica_states", refuse)
    r = Client(raise_request_exception=False).get("/healthz/metrics")
    assert r.status_code == 503 and b"mmc_" not in r.content


# -- docker compose -----------------------------------------------------------------------------

def test_compose_runs_prometheus_and_grafana_only_in_the_monitoring_profile():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {n for n, s in services.items() if "profiles" in s} == {"prometheus", "grafana"}
    assert all(services[n]["profiles"] == ["monitoring"] for n in ("prometheus", "grafana"))
    for name in ("prometheus", "grafana"):
        for volume in services[name]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (REPO / source).exists(), (name, source)
            else:
                assert source in compose["volumes"], (name, source)
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    dns = jobs["mmc-serving"]["dns_sd_configs"][0]
    serve = services["serving"]["command"]
    assert dns["names"] == ["serving"] and str(dns["port"]) == serve[serve.index("--port") + 1]
    assert jobs["mmc-console"]["metrics_path"] == reverse("healthz-metrics")
    assert jobs["mmc-console"]["static_configs"][0]["targets"] == ["console:8000"]


# -- a real Prometheus --------------------------------------------------------------------------

GOOD = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "INT32", "data": [2, 3]}]}
BAD = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "INT32", "data": [1, 1]}]}  # x / 0
#: The bounded wait for each state Prometheus must reach: scraped and evaluated every second,
#: beside processes that burn CPU.
WAIT_S = 30


def divider(version: int) -> bytes:
    """y = x / (x - 1) in INT32: answers [2, 3], fails at run time on [1, 1] (a division by
    zero: 500, counted as a failure); `version` tells the bytes of two uploads apart."""
    one = helper.make_tensor("one", TensorProto.INT32, [], [1])
    graph = helper.make_graph(
        [helper.make_node("Sub", ["x", "one"], ["d"]), helper.make_node("Div", ["x", "d"], ["y"])],
        "divider", [helper.make_tensor_value_info("x", TensorProto.INT32, ["batch", 2])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, ["batch", 2])], [one])
    model = helper.make_model(graph, ir_version=samples.IR_VERSION, doc_string=f"v{version}",
                              opset_imports=[helper.make_opsetid("", samples.OPSET)])
    return model.SerializeToString()


class Prometheus:
    """Debian's prometheus on a free loopback port with its own config and data folder, scraping
    the replicas every second and the console every two, evaluating `rules` every second."""

    def __init__(self, folder: Path, rules: Path, *, serving: list[str], console: str):
        folder.mkdir()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {"job_name": "mmc-serving", "static_configs": [{"targets": serving}]},
                # the console answers slower than a replica on a busy machine
                {"job_name": "mmc-console", "metrics_path": "/healthz/metrics",
                 "scrape_interval": "2s", "scrape_timeout": "2s",
                 "static_configs": [{"targets": [console]}]}]}
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = folder / "prometheus.log"
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={folder / 'prometheus.yml'}",
             f"--storage.tsdb.path={folder / 'data'}",
             f"--web.listen-address={self.url.removeprefix('http://')}"],
            stdout=self.log.open("wb"), stderr=subprocess.STDOUT)
        try:
            wait_answering(self.proc, f"{self.url}/-/ready", self.log, timeout=WAIT_S,
                           what="prometheus")
        except BaseException:
            self.stop()
            raise

    def query(self, expr: str) -> list[dict]:
        body = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10).json()
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def labelled(self, expr: str, want: set[tuple[str, str]]) -> bool:
        """Whether `expr` answers exactly one series per (version, role) of `want`."""
        found = [(s["metric"]["version"], s["metric"].get("role")) for s in self.query(expr)]
        return sorted(found) == sorted(want)

    def alerts(self, name: str, state: str = "firing") -> list[dict]:
        found = httpx.get(f"{self.url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
        return [a["labels"] for a in found
                if a["labels"]["alertname"] == name and a["state"] == state]

    def until(self, what: str, check):
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            found = check()
            if found:
                return found
            time.sleep(0.25)
        raise AssertionError(f"not within {WAIT_S} s: {what}\n{self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        stop_process(self.proc)


def quick_rules(folder: Path) -> Path:
    """A copy of alerts.yml whose `for:` durations are 1 s, and nothing else changed."""
    text, n = re.subn(r"(?m)^(\s+for: )\S+$", r"\g<1>1s", RULES.read_text())
    assert n == sum("for" in rule for rule in alerting_rules())
    copy = folder / "alerts.yml"
    copy.write_text(text)
    return copy


class Traffic:
    """Requests to both replicas from a few threads until stopped: unpinned good ones, and
    once `burst` is set, requests pinned to the candidate that make it divide by zero."""

    def __init__(self, urls: list[str], model: str, candidate: str):
        self.stop, self.burst = threading.Event(), threading.Event()
        self.answers: dict[int, int] = {}
        self.paths = (f"/v2/models/{model}/infer",
                      f"/v2/models/{model}/versions/{candidate}/infer")
        self.threads = [threading.Thread(target=self._loop, args=(url,), daemon=True)
                        for url in urls for _ in range(2)]

    def _loop(self, url: str) -> None:
        with httpx.Client(base_url=url, timeout=10) as http:
            n = 0
            while not self.stop.is_set():
                n += 1
                bad = self.burst.is_set() and n % 2 == 0
                try:
                    r = http.post(self.paths[bad], json=BAD if bad else GOOD)
                    self.answers[r.status_code] = self.answers.get(r.status_code, 0) + 1
                except httpx.HTTPError:
                    pass
                time.sleep(0.01)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(15)


@needs_prometheus
@pytest.mark.timeout(180)
@pytest.mark.django_db(transaction=True)
def test_a_real_prometheus_fires_the_alerts_on_real_replicas_and_answers_every_dashboard_query(
        engineer, ready_model, tmp_path):
    started = time.monotonic()
    for n in (1, 2):
        ready_model("calc", divider(n))
    _, token = credential_create(name="fleet", actor=Actor.system("spec"))
    ports = {name: free_port() for name in ("console", "h1", "h2")}
    # Prometheus first: it takes its targets up some 5 s after it starts, meanwhile they start
    prometheus = Prometheus(tmp_path / "prometheus", quick_rules(tmp_path),
                            serving=[f"127.0.0.1:{ports['h1']}", f"127.0.0.1:{ports['h2']}"],
                            console=f"127.0.0.1:{ports['console']}")
    plane, reps = None, []
    try:
        plane = ControlPlane(tmp_path, port=ports["console"], MMC_REPLICA_STALE_SECONDS="3")
        reps = [Replica(name, embedded=False, log_dir=tmp_path, port=ports[name],
                        follow=plane.url, token=token) for name in ("h1", "h2")]
        reported_in(reps)
        E = "/api/v1/models/calc/endpoint/"
        for op, body in (("deploy", {"version": 1}), ("canary", {"version": 2, "weight": 50})):
            r = engineer.post(f"{E}{op}/?wait=20", body, format="json")
            assert r.status_code == 200 and r.json()["convergence"]["converged"], r.content

        with Traffic([r.url for r in reps], "calc", candidate="2") as traffic:
            # healthy traffic on both versions, scraped and evaluated: both alerts quiet
            prometheus.until("both versions' request rates recorded", lambda: len(
                prometheus.query('model_version:mmc_requests:rate2m{model="calc"} > 0')) == 2)
            time.sleep(2)  # a few evaluations of the rules on healthy figures
            for name in ("MmcVersionErrorRateHigh", "MmcCanaryCandidateWorseThanStable"):
                assert not prometheus.alerts(name, "pending") + prometheus.alerts(name), name

            traffic.burst.set()  # the candidate now fails every other request it is sent
            rate = prometheus.until("the error-rate alert firing",
                                    lambda: prometheus.alerts("MmcVersionErrorRateHigh"))
            assert [(a["model"], a["version"]) for a in rate] == [("calc", "2")]
            canary = prometheus.until("the canary alert firing", lambda: prometheus.alerts(
                "MmcCanaryCandidateWorseThanStable"))
            assert [(a["model"], a["version"], a["role"]) for a in canary] == [
                ("calc", "2", "candidate")]
            assert traffic.answers.get(500) and traffic.answers.get(200), traffic.answers

            unanswered = []
            for title, target in dashboard_targets():
                expr = target["expr"].replace("$model", "calc").replace(
                    "$__rate_interval", "30s")
                if not prometheus.query(expr):
                    unanswered.append(f"{title}: {expr}")
                elif "{{role}}" in target.get("legendFormat", ""):  # a line per role, once
                    prometheus.until(f"{title}: v1 stable, v2 candidate",  # the console answers
                                     partial(prometheus.labelled, expr, {("1", "stable"),
                                                                         ("2", "candidate")}))
            assert not unanswered, "\n".join(unanswered)
            metric, label = model_variable()  # the dashboard's choices of $model
            models = httpx.get(f"{prometheus.url}/api/v1/label/{label}/values",
                               params={"match[]": metric}).json()
            assert models["data"] == ["calc"], models

        reps[1].stop(sig_kill=True)
        lost = prometheus.until("the killed replica reported lost",
                                lambda: prometheus.alerts("MmcReplicaLost"))
        assert [a["replica"] for a in lost] == ["h2"]
    finally:
        for rep in reps:
            rep.stop()
        if plane is not None:
            plane.stop()
        prometheus.stop()
    assert time.monotonic() - started < 120, "the spec's own bound"
