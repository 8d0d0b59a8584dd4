"""Builds dashboards/mmc-deployment.json with grafana-foundation-sdk: the console's deployment
page as a Grafana dashboard (traffic split, replicas, pending requests; requests per second,
error rate and latency p50/p95/p99 per version, the candidate beside its stable).

`python deploy/monitoring/grafana/build.py` rewrites the JSON; tests/test_monitoring.py checks
that the committed file is what this builds and evaluates every query on a real Prometheus.
"""

from __future__ import annotations

import json
from pathlib import Path

from grafana_foundation_sdk.builders import (
    bargauge,
    common,
    dashboard,
    prometheus,
    stat,
    timeseries,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    BigValueGraphMode,
    GraphThresholdsStyleMode,
    LegendDisplayMode,
    LegendPlacement,
    SortOrder,
    TooltipDisplayMode,
)
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    Threshold,
    ThresholdsMode,
    VariableRefresh,
)

OUT = Path(__file__).resolve().parent / "dashboards" / "mmc-deployment.json"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
MODEL = 'model="$model"'
RATE = "$__rate_interval"
#: The legend of every per-version panel: "v2 candidate", as the console's charts say it.
VERSION_LEGEND = "v{{version}} {{role}}"


def with_role(expr: str) -> str:
    """`expr` (one series per model and version) with the version's role from the console
    (mmc_endpoint_traffic_percent): a version no endpoint routes any more keeps its line."""
    return (f"({expr})\n  * on (model, version) group_left (role)\n"
            f"group by (model, version, role) (mmc_endpoint_traffic_percent{{{MODEL}}})\n"
            f"or on (model, version)\n({expr})")


def requests(window: str = RATE) -> str:
    return (f"sum by (model, version) (rate(nv_inference_request_success{{{MODEL}}}[{window}])"
            f" + rate(nv_inference_request_failure{{{MODEL}}}[{window}]))")


def failures(window: str = RATE) -> str:
    return f"sum by (model, version) (rate(nv_inference_request_failure{{{MODEL}}}[{window}]))"


def latency(quantile: float) -> str:
    return (f"histogram_quantile({quantile}, sum by (model, version, le) "
            f"(rate(mmc_inference_request_duration_seconds_bucket{{{MODEL}}}[{RATE}])))")


def query(expr: str, legend: str, ref: str = "A", *, instant: bool = False):
    q = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)
    return q.instant() if instant else q


def last_value():
    return common.ReduceDataOptions().calcs(["lastNotNull"])


def red_above(value: float):
    return dashboard.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(
        [Threshold(value=None, color="green"), Threshold(value=value, color="red")])


def per_version(title: str, description: str, expr: str, unit: str, *, width: int,
                threshold: float | None = None):
    """A time series panel, one line per version (stable, candidate, blue, green, shadow)."""
    panel = (timeseries.Panel().title(title).description(description).datasource(DATASOURCE)
             .unit(unit).min(0).span(width).height(8)
             .legend(common.VizLegendOptions().display_mode(LegendDisplayMode.LIST)
                     .placement(LegendPlacement.BOTTOM).show_legend(True))
             .tooltip(common.VizTooltipOptions().mode(TooltipDisplayMode.MULTI)
                      .sort(SortOrder.DESCENDING))
             .with_target(query(with_role(expr), VERSION_LEGEND)))
    if threshold is not None:  # the alert's threshold, drawn as a line
        panel = (panel.thresholds(red_above(threshold))
                 .thresholds_style(common.GraphThresholdsStyleConfig()
                                   .mode(GraphThresholdsStyleMode.LINE)))
    return panel


def build() -> dashboard.Dashboard:
    replicas = (
        stat.Panel().title("Replicas").description(
            "Serving replicas the console knows: live, lost (no heartbeat within "
            "MMC_REPLICA_STALE_SECONDS) and behind the desired route revision.")
        .datasource(DATASOURCE).span(8).height(6).graph_mode(BigValueGraphMode.NONE)
        .reduce_options(last_value())
        .with_target(query("sum(max by (replica) (mmc_replica_lost) == bool 0)", "live", "A",
                           instant=True))
        .with_target(query("sum(max by (replica) (mmc_replica_lost))", "lost", "B",
                           instant=True))
        .with_target(query("sum(max by (replica) (mmc_replica_behind_seconds) > bool 0)",
                           "behind", "C", instant=True)))
    split = (
        bargauge.Panel().title("Traffic split").description(
            "Share of the model's unpinned traffic per version and role, as the console "
            "routes it (blue-green's idle slot and the shadow at 0 %).")
        .datasource(DATASOURCE).unit("percent").min(0).max(100).span(8).height(6)
        .reduce_options(last_value())
        .with_target(query(f"max by (version, role) (mmc_endpoint_traffic_percent{{{MODEL}}})",
                           VERSION_LEGEND, instant=True)))
    pending = per_version(
        "Pending requests", "Requests waiting for an instance, summed over replicas "
        "(nv_inference_pending_request_count); a queue holds max_queue_size at most.",
        f"sum by (model, version) (nv_inference_pending_request_count{{{MODEL}}})", "short",
        width=8)
    return (
        dashboard.Dashboard("Model deployment").uid("mmc-deployment")
        .description("One model's rollout as the console's deployment page shows it, from "
                     "the serving replicas' /metrics and the console's /healthz/metrics.")
        .tags(["mmc"]).refresh("10s").time("now-1h", "now").timezone("browser")
        .with_variable(dashboard.DatasourceVariable("datasource").label("Data source")
                       .type("prometheus"))
        .with_variable(dashboard.QueryVariable("model").label("Model").datasource(DATASOURCE)
                       .query("label_values(nv_inference_request_success, model)")
                       .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(1))
        .with_row(dashboard.Row("Rollout"))
        .with_panel(split).with_panel(replicas).with_panel(pending)
        .with_row(dashboard.Row("Per version: the candidate beside its stable"))
        .with_panel(per_version(
            "Requests per second", "Requests answered or failed, summed over replicas.",
            requests(), "reqps", width=12))
        .with_panel(per_version(
            "Error rate", "Failed requests (nv_inference_request_failure) of all; the line is "
            "MmcVersionErrorRateHigh's threshold.",
            f"{failures()}\n/\n{requests()}", "percentunit", width=12, threshold=0.05))
        .with_panel(per_version("Latency p50", "Successful requests, queue and compute "
                                "included.", latency(0.5), "s", width=8))
        .with_panel(per_version("Latency p95", "Successful requests, queue and compute "
                                "included.", latency(0.95), "s", width=8))
        .with_panel(per_version("Latency p99", "Successful requests, queue and compute "
                                "included; the line is MmcVersionLatencyP99High's threshold.",
                                latency(0.99), "s", width=8, threshold=1.0))
    )


def render() -> str:
    """The dashboard as the committed file holds it: sorted keys, numbered panels."""
    model = json.loads(json.dumps(build().build(), cls=JSONEncoder))
    for n, panel in enumerate(model["panels"], 1):
        panel["id"] = n
    return json.dumps(model, indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}")
