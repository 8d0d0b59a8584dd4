"""Serving statistics: the Triton statistics extension, quantiles, snapshots a dashboard can diff,
and Prometheus text with Triton's metric names."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from registry import samples
from serving.core.batching import DynamicBatcher
from serving.core.desired_state import BatchingConfig
from serving.core.runtime import OnnxRuntime
from serving.core.stats import (
    LATENCY_BUCKETS_S,
    ServingCollector,
    VersionStats,
    quantile_from_buckets,
    render_metrics,
)

TRITON_COUNTERS = [
    "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
    "nv_inference_exec_count", "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us", "nv_inference_compute_infer_duration_us",
]


@pytest.fixture(scope="module")
def served() -> VersionStats:
    """Stats of a real version after 40 concurrent requests through the batcher."""
    rt = OnnxRuntime(samples.mlp(), intra_op_threads=1).load()
    b = DynamicBatcher(rt.predict, BatchingConfig(max_batch_size=8), VersionStats("mlp", "3"))
    x = np.ones((1, 64), np.float32)

    async def main():
        await asyncio.gather(*(b.infer({"x": x}) for _ in range(40)))

    asyncio.run(main())
    return b.stats


def test_latency_buckets_span_50_microseconds_to_30_seconds():
    assert LATENCY_BUCKETS_S[0] == pytest.approx(50e-6)
    assert LATENCY_BUCKETS_S[-1] == pytest.approx(30.0)
    assert list(LATENCY_BUCKETS_S) == sorted(set(LATENCY_BUCKETS_S))


def test_statistics_follow_the_triton_extension_shape(served):
    t = served.to_triton()
    assert set(t) == {"name", "version", "last_inference", "inference_count",
                      "execution_count", "inference_stats", "batch_stats"}
    assert (t["name"], t["version"]) == ("mlp", "3")
    assert set(t["inference_stats"]) == {"success", "fail", "queue", "compute_input",
                                         "compute_infer", "compute_output", "cache_hit",
                                         "cache_miss"}
    for d in t["inference_stats"].values():
        assert set(d) == {"count", "ns"}
    assert t["inference_count"] == 40
    assert t["execution_count"] < 40  # batched: the ratio is the achieved batch size
    assert sum(b["compute_infer"]["count"] for b in t["batch_stats"]) == t["execution_count"]
    assert all(1 <= b["batch_size"] <= 8 for b in t["batch_stats"])


def test_quantiles_come_from_the_histogram_within_a_bucket():
    s = VersionStats("m", "1")
    assert s.quantile(0.5) is None
    for ms in range(1, 101):  # 1 ms .. 100 ms, uniform
        s.record_success(ms * 1_000_000)
    p50, p95, p99 = s.quantile(0.5), s.quantile(0.95), s.quantile(0.99)
    assert p50 == pytest.approx(0.050, rel=0.25)
    assert p95 == pytest.approx(0.095, rel=0.25)
    assert p99 == pytest.approx(0.099, rel=0.25)
    assert p50 <= p95 <= p99 <= 0.1 + 1e-9
    s.record_success(100 * 1_000_000_000)  # beyond the last bucket
    assert s.quantile(1.0) == pytest.approx(LATENCY_BUCKETS_S[-1])


def test_failures_count_as_errors_but_stay_out_of_the_latency_histogram():
    s = VersionStats("m", "1")
    s.record_success(2_000_000)
    s.record_failure(9_000_000_000)
    snap = s.snapshot()
    assert (snap["count"], snap["errors"]) == (2, 1)
    assert sum(snap["latency_buckets"]) == 1
    assert s.to_triton()["inference_stats"]["fail"] == {"count": 1, "ns": 9_000_000_000}


def test_two_snapshots_diff_into_a_window_a_dashboard_can_read():
    s = VersionStats("m", "1")
    for _ in range(50):
        s.record_success(200_000_000)  # an old slow period: 200 ms
    before = s.snapshot()
    for _ in range(100):
        s.record_success(1_000_000)  # the window: 1 ms
    s.record_failure(1_000_000)
    after = s.snapshot()
    window = [a - b for a, b in zip(after["latency_buckets"], before["latency_buckets"],
                                    strict=True)]
    assert after["count"] - before["count"] == 101
    assert after["errors"] - before["errors"] == 1
    p99 = quantile_from_buckets(after["bucket_bounds_s"], window, 0.99)
    assert p99 == pytest.approx(0.001, rel=0.25)
    assert s.quantile(0.99) > 0.1  # the cumulative view still remembers the slow period
    assert len(after["latency_buckets"]) == len(after["bucket_bounds_s"]) + 1


def scrape(stats: list[VersionStats], replica: str = "replica-a") -> tuple[str, str]:
    registry = CollectorRegistry()
    registry.register(ServingCollector(replica, lambda: stats))
    body, content_type = render_metrics(registry)
    return body.decode(), content_type


def test_prometheus_text_has_triton_counter_names_labelled_by_model_version_replica(served):
    text, content_type = scrape([served])
    assert content_type.startswith("text/plain")
    for name in TRITON_COUNTERS:
        assert f"# TYPE {name} counter" in text
        assert f'{name}{{model="mlp",replica="replica-a",version="3"}} ' in text
    for name in TRITON_COUNTERS:  # Triton's names, not prometheus_client's renaming
        assert f"{name}_total" not in text
    assert '# TYPE nv_inference_pending_request_count gauge' in text
    assert 'nv_inference_request_success{model="mlp",replica="replica-a",version="3"} 40' in text
    assert 'nv_inference_count{model="mlp",replica="replica-a",version="3"} 40' in text


def test_prometheus_text_parses_and_its_values_match_the_statistics(served):
    text, _ = scrape([served])
    families = {f.name: f for f in text_string_to_metric_families(text)}
    exec_count = families["nv_inference_exec_count"].samples[0]
    assert exec_count.value == served.execution_count
    assert exec_count.labels == {"model": "mlp", "version": "3", "replica": "replica-a"}
    hist = families["mmc_inference_request_duration_seconds"]
    assert hist.type == "histogram"
    buckets = [s for s in hist.samples if s.name.endswith("_bucket")]
    assert len(buckets) == len(LATENCY_BUCKETS_S) + 1
    assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == 40
    assert [b.value for b in buckets] == sorted(b.value for b in buckets)  # cumulative
    count = next(s for s in hist.samples if s.name.endswith("_count"))
    assert count.value == 40


def test_versions_appear_and_disappear_with_what_the_provider_returns(served):
    other = VersionStats("mlp", "4")
    other.pending = 3
    text, _ = scrape([served, other])
    assert 'nv_inference_pending_request_count{model="mlp",replica="replica-a",version="4"} 3.0' \
        in text
    text, _ = scrape([other])
    assert 'version="3"' not in text
    text, _ = scrape([])
    assert "nv_inference_request_success{" not in text


def test_label_values_are_escaped():
    s = VersionStats('we"ird\\name', "1")
    s.record_success(1000)
    text, _ = scrape([s])
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["nv_inference_request_success"].samples[0].labels["model"] == 'we"ird\\name'
