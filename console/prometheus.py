"""The control plane's Prometheus metrics (`/healthz/metrics`): what only the registry knows and
the alert rules of deploy/monitoring need. Each replica live or lost, the revision it has applied
and how long it has been behind the desired one; each endpoint's revision and its versions with
their role (stable, candidate, blue, green, shadow), share of traffic and queue size. Read at
scrape time from three small queries; the replicas' own counters are on their /metrics."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone
from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from registry import selectors
from registry.models import Endpoint, ReplicaHeartbeat
from registry.notify import current_revision
from serving.core.stats import CONTENT_TYPE


def families(*, revision: int, replicas: list[ReplicaHeartbeat], endpoints: list[Endpoint],
             now: datetime) -> list[Metric]:
    """The metric families for this state of the registry (no query of its own)."""
    desired = GaugeMetricFamily(
        "mmc_desired_route_revision", "Route revision every replica should have applied "
        "(the registry's current one)", value=revision)
    lost = GaugeMetricFamily(
        "mmc_replica_lost", "1 while the replica is lost (no heartbeat within "
        "MMC_REPLICA_STALE_SECONDS), 0 while it is live", labels=["replica"])
    applied = GaugeMetricFamily(
        "mmc_replica_applied_revision", "Route revision the replica last said it has applied",
        labels=["replica"])
    behind = GaugeMetricFamily(
        "mmc_replica_behind_seconds", "Seconds the replica has said, without a break, that it "
        "is behind the desired route revision (0 at it)", labels=["replica"])
    for r in replicas:
        lost.add_metric([r.replica], 1 if r.lost else 0)
        applied.add_metric([r.replica], r.revision)
        late = r.behind_since if r.revision < revision else None
        behind.add_metric([r.replica], max((now - late).total_seconds(), 0.0) if late else 0)
    endpoint_revision = GaugeMetricFamily(
        "mmc_endpoint_revision", "Route revision of the endpoint's latest change: a replica "
        "serves the model's desired state once its applied revision reaches it",
        labels=["model"])
    traffic = GaugeMetricFamily(
        "mmc_endpoint_traffic_percent", "Percent of the endpoint's unpinned traffic routed to "
        "the version, one role per version (blue-green's idle slot and the shadow at 0)",
        labels=["model", "version", "role"])
    queue = GaugeMetricFamily(
        "mmc_version_max_queue_size", "Requests a replica lets wait for the version before "
        "refusing more (503): the bound of nv_inference_pending_request_count",
        labels=["model", "version"])
    for ep in endpoints:
        model = ep.model.name
        endpoint_revision.add_metric([model], ep.revision)
        routed = {v.pk: v for v in (ep.stable, ep.candidate, ep.blue, ep.green, ep.shadow) if v}
        for role, version, percent in ep.routing.map(routed.get).roles():
            traffic.add_metric([model, str(version.number), role], percent)
            queue.add_metric([model, str(version.number)], version.max_queue_size)
    return [desired, lost, applied, behind, endpoint_revision, traffic, queue]


class _Families:
    """What generate_latest reads: a fixed list of families."""

    def __init__(self, metrics: list[Metric]):
        self._metrics = metrics

    def collect(self) -> list[Metric]:
        return self._metrics


def render() -> tuple[bytes, str]:
    """The exposition text of the registry as it is now, and its content type."""
    metrics = families(revision=current_revision(), replicas=selectors.replica_states(),
                       endpoints=selectors.endpoint_routes(), now=timezone.now())
    return generate_latest(_Families(metrics)), CONTENT_TYPE  # type: ignore[arg-type]
