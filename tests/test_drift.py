"""Baselines and drift: feature statistics match numpy; a version's baseline comes from an
uploaded dataset or from captured traffic (a dataset that does not fit the signature is a 400
naming the tensor, nothing written); the periodic drift task raises a one-feature +2σ shift in
one period, raises nothing over 50 windows of same-distribution traffic, audits an episode once
when it starts and once when it ends, and fires one monitor.drift webhook (also for a shift
sent through a real replica with capture on); thresholds out of range are 400s naming the
field."""

from __future__ import annotations

import time

import numpy as np
import pytest

from registry import samples, services
from registry.audit import Actor
from registry.monitoring import capture_store, stats
from registry.services.drift import drift_tick
from tests.test_jobs import npy_bytes, upload_dataset
from tests.test_webhooks import Receiver, hook, wait_deliveries

pytestmark = pytest.mark.django_db(transaction=True)
ME = Actor.system("spec")
FEATURES = 4


# ------------------------------------------------------------------------------ statistics


def test_numeric_statistics_match_numpy_and_keep_their_bin_edges():
    rng = np.random.default_rng(1)
    x = rng.normal([0, 5, -3], [1, 2, 0.5], size=(10_000, 3)).astype(np.float32)
    got = stats.summarise("x", x)
    assert list(got) == ["x[0]", "x[1]", "x[2]"]
    for i in range(3):
        s, col = got[f"x[{i}]"], x[:, i].astype(np.float64)
        assert s["count"] == 10_000 and s["tensor"] == "x"
        assert s["mean"] == pytest.approx(col.mean()) and s["std"] == pytest.approx(col.std())
        assert (s["min"], s["max"]) == (pytest.approx(col.min()), pytest.approx(col.max()))
        assert s["quantiles"]["0.5"] == pytest.approx(np.median(col))
        assert sum(s["counts"]) == 10_000 and len(s["counts"]) == len(s["edges"]) - 1
        assert s["edges"][0] is None and s["edges"][-1] is None  # open ends: ±inf
        # the same edges bin the same data into the same counts (what PSI relies on)
        assert np.histogram(col, bins=stats.edges_of(s))[0].tolist() == s["counts"]
        assert len(s["sample"]) == stats.SAMPLE
    assert stats.psi(got["x[0]"]["counts"], got["x[0]"]["counts"]) == 0.0


def test_tensor_shapes_give_one_feature_per_column_or_one_flattened_summary():
    rng = np.random.default_rng(2)
    assert list(stats.summarise("a", rng.random(50))) == ["a"]
    assert list(stats.summarise("a", rng.random((50, 1)))) == ["a"]
    image = stats.summarise("img", rng.random((5, 3, 4, 4)))
    assert list(image) == ["img"] and image["img"]["flattened"] and image["img"]["count"] == 240


def test_strings_keep_the_top_k_and_count_the_rest_as_other():
    words = np.array([b"cat"] * 50 + [b"dog"] * 30 + [f"w{i}".encode() for i in range(40)],
                     dtype=object)
    s = stats.summarise("animal", words)["animal"]
    assert s["kind"] == "categorical" and s["count"] == 120 and s["distinct"] == 42
    assert list(s["top"])[:2] == ["cat", "dog"] and s["top"]["cat"] == 50
    assert len(s["top"]) == stats.TOP_K and s["other"] == 120 - sum(s["top"].values())


# ------------------------------------------------------------------------------- baselines


def rows(rng, n: int, shift: float = 0.0, feature: int = 2) -> np.ndarray:
    x = rng.standard_normal((n, FEATURES)).astype(np.float32)
    x[:, feature] += shift
    return x


def records(x: np.ndarray, *, t0: float, t1: float, batch: int = 10, version: int = 1,
            model: str = "watched") -> list[dict]:
    """Captured records of batches of rows of `x`, spread evenly over [t0, t1)."""
    n = len(x) // batch
    out = []
    for i in range(n):
        part = x[i * batch:(i + 1) * batch]
        out.append({"id": f"r{t0:.0f}-{i}", "model": model, "version": version,
                    "role": "stable", "ts": t0 + (t1 - t0) * i / n, "latency_ms": 1.0,
                    "inputs": {"x": {"datatype": "FP32", "shape": list(part.shape),
                                     "data": part.reshape(-1).tolist()}},
                    "outputs": {"y": {"datatype": "FP32", "shape": [len(part), 3],
                                      "data": np.tanh(part[:, :3]).reshape(-1).tolist()}},
                    "truncated": False})
    return out


@pytest.fixture
def watched(ready_model):
    ready_model("watched", samples.mlp(n_in=FEATURES, hidden=(8,), n_out=3, seed=1))
    services.endpoint_deploy(model_name="watched", version_number=1, actor=ME)
    return "watched"


def test_a_baseline_from_a_dataset_is_stored_audited_and_read_back(engineer, watched):
    from registry.models import AuditEvent

    x = rows(np.random.default_rng(4), 5000)
    ds = upload_dataset(engineer, npy_bytes(x), "baseline.npy")
    r = engineer.post("/api/v1/models/watched/versions/1/baseline/", {"dataset": ds["id"]},
                      format="json")
    assert r.status_code == 201, r.content
    body = engineer.get("/api/v1/models/watched/versions/1/baseline/").json()
    assert body["source"] == "dataset" and body["rows"] == 5000
    assert list(body["features"]["inputs"]) == [f"x[{i}]" for i in range(FEATURES)]
    assert body["features"]["inputs"]["x[1]"]["mean"] == pytest.approx(x[:, 1].mean(), abs=1e-6)
    assert AuditEvent.objects.filter(action="version.baseline", target="watched:1").count() == 1


@pytest.mark.parametrize(("array", "field", "says"), [
    (np.zeros((10, 5), np.float32), "dataset.x", "shape [5]"),
    (np.zeros((10, 4), np.complex64), "dataset.x", "complex64"),
])
def test_a_dataset_that_does_not_fit_the_signature_is_refused_naming_the_tensor(
        engineer, watched, array, field, says):
    from registry.models import AuditEvent, Baseline

    ds = upload_dataset(engineer, npy_bytes(array), "wrong.npy")
    r = engineer.post("/api/v1/models/watched/versions/1/baseline/", {"dataset": ds["id"]},
                      format="json")
    assert r.status_code == 400, r.content
    assert r.json()["field"] == field and says in r.json()["error"], r.json()
    assert Baseline.objects.count() == 0
    assert not AuditEvent.objects.filter(action="version.baseline").exists()


def test_a_baseline_from_captured_traffic_covers_inputs_and_outputs(engineer, watched):
    now = time.time()
    capture_store.write_records(records(rows(np.random.default_rng(5), 3000), t0=now - 600,
                                        t1=now - 60), writer="spec")
    r = engineer.post("/api/v1/models/watched/versions/1/baseline/",
                      {"since": _iso(now - 900), "until": _iso(now)}, format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["source"] == "capture" and body["rows"] == 3000
    assert list(body["features"]["outputs"]) == ["y[0]", "y[1]", "y[2]"]
    both = engineer.post("/api/v1/models/watched/versions/1/baseline/",
                         {"dataset": "6f1c2d4e-8a0b-4c1d-9e2f-3a4b5c6d7e8f",
                          "since": _iso(now - 900)}, format="json")
    assert both.status_code == 400 and both.json()["field"] == "since"
    empty = engineer.post("/api/v1/models/watched/versions/1/baseline/",
                          {"since": _iso(now - 9000), "until": _iso(now - 8000)}, format="json")
    assert empty.status_code == 400 and empty.json()["field"] == "since"


def _iso(ts: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC).isoformat()


# ----------------------------------------------------------------------------------- drift


def _baseline(engineer, seed: int = 6, model: str = "watched") -> None:
    ds = upload_dataset(engineer, npy_bytes(rows(np.random.default_rng(seed), 20_000)), "b.npy")
    assert engineer.post(f"/api/v1/models/{model}/versions/1/baseline/", {"dataset": ds["id"]},
                         format="json").status_code == 201


@pytest.fixture
def receiver():
    made = Receiver()
    yield made
    made.server.shutdown()
    made.server.server_close()


def test_a_two_sigma_shift_of_one_feature_is_raised_in_one_period_audited_once_and_hooked_once(
        engineer, admin, watched, receiver):
    from registry.models import AuditEvent, DriftEpisode

    _baseline(engineer)
    hook(admin, receiver.url, model="watched", events=["monitor.drift"])
    assert engineer.put("/api/v1/models/watched/endpoint/drift/", {"window_minutes": 5},
                        format="json").status_code == 200
    rng, now = np.random.default_rng(7), time.time() - 7200  # a stretch no other spec writes
    for k in range(3):  # three periods of shifted traffic: one episode
        end = now + k * 300
        capture_store.write_records(records(rows(rng, 1000, shift=2.0), t0=end - 290, t1=end),
                                    writer="spec")
        drift_tick(now=end)
        if k == 0:
            flagged = engineer.get("/api/v1/models/watched/endpoint/drift/").json()
            assert [p["feature"] for p in flagged["points"] if p["drifted"]] == ["x[2]"]
            assert flagged["episodes"][0]["ended_at"] is None
    end = now + 3 * 300  # back to normal: the episode ends
    capture_store.write_records(records(rows(rng, 1000), t0=end - 290, t1=end), writer="spec")
    drift_tick(now=end)

    started = AuditEvent.objects.filter(action="monitor.drift")
    assert started.count() == 1 and started[0].after["features"][0]["feature"] == "x[2]"
    assert AuditEvent.objects.filter(action="monitor.drift.end").count() == 1
    episode = DriftEpisode.objects.get()
    assert episode.features == ["x[2]"] and episode.ended_at is not None
    wait_deliveries(1)
    time.sleep(0.5)
    assert [c["event"] for c in receiver.calls] == ["monitor.drift"]
    call = receiver.calls[0]["json"]
    assert call["model"] == "watched" and call["version"] == 1 and receiver.calls[0]["verified"]


def test_fifty_windows_of_same_distribution_traffic_raise_nothing(engineer, watched):
    from registry.models import AuditEvent, DriftEpisode, DriftPoint

    _baseline(engineer)
    engineer.put("/api/v1/models/watched/endpoint/drift/", {"window_minutes": 1},
                 format="json")
    rng, start = np.random.default_rng(8), time.time() - 4 * 3600
    for k in range(50):
        end = start + (k + 1) * 60
        capture_store.write_records(records(rows(rng, 500), t0=end - 59, t1=end),
                                    writer="spec")
        drift_tick(now=end)
    points = DriftPoint.objects.filter(part="inputs")
    windows = points.values("window_end").distinct().count()
    flagged = points.filter(drifted=True).count()
    print(f"\n50 windows x {FEATURES} input features: {flagged} drifted points, false-positive "
          f"rate {flagged / points.count():.4f}; max PSI "
          f"{max(p.psi for p in points):.3f}, min p {min(p.p_value for p in points):.2g}")
    assert windows == 50 and flagged == 0
    assert DriftEpisode.objects.count() == 0
    assert not AuditEvent.objects.filter(action="monitor.drift").exists()


@pytest.mark.parametrize(("body", "field"), [
    ({"psi_threshold": 0}, "psi_threshold"),
    ({"psi_threshold": "high"}, "psi_threshold"),
    ({"p_value": 0.9}, "p_value"),
    ({"p_value": True}, "p_value"),
    ({"window_minutes": 0}, "window_minutes"),
    ({"window_minutes": 2.5}, "window_minutes"),
    ({"min_samples": 5}, "min_samples"),
    ({"window": 5}, "window"),
])
def test_thresholds_out_of_range_are_refused_naming_the_field(engineer, watched, body, field):
    from registry.models import AuditEvent, DriftSettings

    r = engineer.put("/api/v1/models/watched/endpoint/drift/", body, format="json")
    assert r.status_code == 400 and r.json()["field"] == field, r.content
    assert DriftSettings.objects.count() == 0
    assert not AuditEvent.objects.filter(action="endpoint.drift-settings").exists()


def test_thresholds_are_set_audited_and_need_the_engineer_role(client_for, engineer, watched):
    from registry.models import AuditEvent

    assert client_for("viewer").put("/api/v1/models/watched/endpoint/drift/",
                                    {"psi_threshold": 0.3}, format="json").status_code == 403
    r = engineer.put("/api/v1/models/watched/endpoint/drift/",
                     {"psi_threshold": 0.3, "min_samples": 100}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["psi_threshold"] == 0.3 and r.json()["p_value"] == 0.01
    event = AuditEvent.objects.get(action="endpoint.drift-settings")
    assert event.after == {"psi_threshold": 0.3, "min_samples": 100}
    assert client_for("viewer").get("/api/v1/models/watched/endpoint/drift/").json()[
        "min_samples"] == 100


# ------------------------------------------------------------------------------------- CLI


def test_the_cli_computes_a_baseline_and_sets_thresholds(live_server, engineer, watched,
                                                         tmp_path, capsys):
    import json

    from registry.cli.main import main
    from registry.services import token_create

    _, raw = token_create(username="engineer", name="cli", actor=ME)

    def cli(*argv) -> int:
        return main(["--url", live_server.url, "--token", raw, *argv])

    ds = upload_dataset(engineer, npy_bytes(rows(np.random.default_rng(9), 400)), "b.npy")
    capsys.readouterr()
    assert cli("baseline", "watched", "1", "--dataset", ds["id"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 400
    assert cli("baseline", "watched", "1") == 0
    assert "x[3]" in json.loads(capsys.readouterr().out)["features"]["inputs"]
    assert cli("drift", "watched", "--psi-threshold", "0.3", "--window-minutes", "15") == 0
    body = json.loads(capsys.readouterr().out)
    assert (body["psi_threshold"], body["window_minutes"]) == (0.3, 15)
    assert cli("drift", "watched", "--min-samples", "1") == 1
    assert "min_samples" in capsys.readouterr().err


# ----------------------------------------------------------------------------------- pages


def drifted_history(engineer, *, windows: int = 12) -> None:
    """A baseline, then `windows` compared windows 5 minutes apart, the last four shifted."""
    _baseline(engineer)
    engineer.put("/api/v1/models/watched/endpoint/drift/", {"window_minutes": 5}, format="json")
    rng, now = np.random.default_rng(10), time.time()
    for k in range(windows):
        end = now - (windows - 1 - k) * 300
        shift = 2.0 if k >= windows - 4 else 0.0
        capture_store.write_records(records(rows(rng, 800, shift=shift), t0=end - 290, t1=end),
                                    writer="spec")
        drift_tick(now=end)


def test_the_version_page_shows_the_baseline_and_the_deployment_page_charts_drift(
        engineer, users, watched):
    from django.test import Client

    page = Client()
    page.force_login(users["viewer"])
    empty = page.get("/models/watched/versions/1/baseline/").content.decode()
    assert "No baseline yet" in empty
    drifted_history(engineer)
    section = page.get("/models/watched/versions/1/baseline/").content.decode()
    assert section.count('data-feature="x[') == FEATURES and section.count("<rect ") == 40
    card = page.get("/models/watched/deployment/drift/?range=1h").content.decode()
    assert 'id="drift-v1"' in card and 'data-label="x[2]"' in card
    assert 'data-label="threshold"' in card and "(ongoing)" in card
    assert 'aria-current="true">1 hour' in card
    assert "/deployment/drift/" in page.get("/models/watched/deployment/").content.decode()


# ------------------------------------------------------------------- through a real replica


def test_a_shift_sent_through_a_real_replica_is_captured_and_raised(engineer, ready_model,
                                                                    tmp_path):
    import httpx

    from registry.models import AuditEvent
    from tests.replicas import replicas, wait_until
    from tests.test_capture import version_state

    # a model of its own: the artifact store outlives each test, and other specs wrote
    # "watched" records in the last hour
    ready_model("relayed", samples.mlp(n_in=FEATURES, hidden=(8,), n_out=3, seed=1))
    services.endpoint_deploy(model_name="relayed", version_number=1, actor=ME)
    _baseline(engineer, model="relayed")
    assert engineer.put("/api/v1/models/relayed/endpoint/capture/", {"percent": 100},
                        format="json").status_code == 200
    shifted = rows(np.random.default_rng(11), 800, shift=2.0)
    started = time.time() - 1
    with replicas(1, embedded=True, log_dir=tmp_path, MMC_CAPTURE_FLUSH_SECONDS="0.3") as (rep,):
        wait_until(lambda: version_state(rep.name, "relayed:1").get("state") == "READY",
                   timeout=60, what="relayed:1 loaded")
        with httpx.Client(base_url=rep.url, timeout=30) as http:
            for i in range(0, 800, 20):
                batch = shifted[i:i + 20]
                r = http.post("/v2/models/relayed/infer", json={"inputs": [
                    {"name": "x", "shape": list(batch.shape), "datatype": "FP32",
                     "data": batch.reshape(-1).tolist()}]})
                assert r.status_code == 200, r.text
        wait_until(lambda: len(list(capture_store.iter_records(
            "relayed", since=started))) == 40, timeout=30, what="40 records stored")
    done = drift_tick()
    assert done["drifted"] >= 1, done
    raised = AuditEvent.objects.get(action="monitor.drift", model_name="relayed")
    assert "x[2]" in [f["feature"] for f in raised.after["features"]]
