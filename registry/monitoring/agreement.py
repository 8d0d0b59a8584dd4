"""How a canary candidate's answers compare with the stable's, over an analysis window.

Replicas count the comparison of mirrored requests (serving/core/mirror.py) and send the
cumulative counters in their heartbeats; they are stored beside each version's request counters
(MetricSample.mirror) and read here as the difference of two samples per replica, summed, so
the window is the analysis step's, as for error rate and p99 (registry/metrics.py)."""

from __future__ import annotations

import math
from datetime import datetime

import numpy as np
from django.conf import settings
from scipy.spatial.distance import jensenshannon

from registry.metrics import replica_windows
from registry.models import MetricSample
from serving.core.mirror import largest_diff

_SUMMED = ("requests", "errors", "compared_rows", "argmax_agree", "values", "abs_diff_sum")
_LISTS = ("diff_buckets", "stable_values", "candidate_values")


def _minus(new: dict, old: dict | None) -> dict:
    """Counters between two cumulative samples; a drop (a restart, a new stable) restarts."""
    if old is None or new.get("requests", 0) < old.get("requests", 0) \
            or new.get("against") != old.get("against"):
        return {k: new.get(k) for k in (*_SUMMED, *_LISTS)}
    out = {k: new.get(k, 0) - old.get(k, 0) for k in _SUMMED}
    for k in _LISTS:
        out[k] = [a - b for a, b in zip(new.get(k, []), old.get(k, []), strict=False)]
    return out


def mirror_window(model: str, version: int, since: datetime) -> dict:
    """The comparison of `version`'s mirrored answers with the stable's since `since`, all
    replicas: agreement (share of equal argmax), mean and largest absolute difference, and the
    Jensen-Shannon distance between the two output distributions."""
    since_bucket = int(since.timestamp()) // settings.METRICS_BUCKET_SECONDS
    rows = MetricSample.objects.filter(model_name=model, version=version, mirror__isnull=False)
    total = {k: 0 for k in _SUMMED} | {k: [] for k in _LISTS}
    for latest, base in replica_windows(rows, since_bucket):
        part = _minus(latest.mirror, base.mirror if base else None)
        for k in _SUMMED:
            total[k] += part[k] or 0
        for k in _LISTS:
            ours, theirs = total[k], list(part[k] or [])
            n = max(len(ours), len(theirs))
            total[k] = [a + b for a, b in zip(ours + [0] * (n - len(ours)),
                                               theirs + [0] * (n - len(theirs)), strict=True)]
    return summary(total)


def summary(counts: dict) -> dict:
    """The figures the analysis judges, from summed counters."""
    rows, values = counts["compared_rows"], counts["values"]
    largest = largest_diff(counts["diff_buckets"]) if values else None
    distance = None
    s, c = np.array(counts["stable_values"], float), np.array(counts["candidate_values"], float)
    if s.sum() > 0 and c.sum() > 0 and len(s) == len(c):
        distance = float(jensenshannon(s / s.sum(), c / c.sum(), base=2))
        distance = 0.0 if not math.isfinite(distance) else round(distance, 6)
    return {"mirrored": counts["requests"], "mirror_errors": counts["errors"],
            "compared_rows": rows, "compared_values": values,
            "agreement": counts["argmax_agree"] / rows if rows else None,
            "mean_abs_diff": counts["abs_diff_sum"] / values if values else None,
            "max_abs_diff": None if largest is None or math.isinf(largest) else largest,
            "max_abs_diff_beyond_range": bool(largest is not None and math.isinf(largest)),
            "distribution_distance": distance}


def judge(plan, task: str, figures: dict) -> str | None:
    """Why the candidate's answers fail the plan's agreement checks, or None (also while fewer
    than plan.min_compared rows or values were compared: nothing is judged on too little)."""
    if task == "classifier" and plan.min_agreement is not None:
        rows = figures["compared_rows"]
        if rows >= max(plan.min_compared, 1) and figures["agreement"] < plan.min_agreement:
            return (f"candidate agrees with the stable on {100 * figures['agreement']:.1f} % of "
                    f"{rows} mirrored rows (argmax) < {100 * plan.min_agreement:.1f} %")
    if figures["compared_values"] < max(plan.min_compared, 1):
        return None
    largest = math.inf if figures["max_abs_diff_beyond_range"] else figures["max_abs_diff"]
    if plan.max_abs_diff is not None and largest is not None and largest > plan.max_abs_diff:
        return (f"candidate's answers differ from the stable's by up to {largest:g} "
                f"(absolute) > {plan.max_abs_diff:g}")
    mean = figures["mean_abs_diff"]
    if plan.max_mean_abs_diff is not None and mean is not None and mean > plan.max_mean_abs_diff:
        return (f"candidate's answers differ from the stable's by {mean:.4g} on average "
                f"> {plan.max_mean_abs_diff:g}")
    distance = figures["distribution_distance"]
    if (plan.max_distribution_distance is not None and distance is not None
            and distance > plan.max_distribution_distance):
        return (f"candidate's output distribution is {distance:.3f} (Jensen-Shannon) from the "
                f"stable's > {plan.max_distribution_distance:g}")
    return None


def answers_check(plan, *, model, candidate, stable, since: datetime) -> dict:
    """The plan's answer checks for one analysis pass: {"figures", "why" (a rollback reason or
    None), "waiting" (why promotion must wait for more comparisons, or None)}."""
    from registry.monitoring.quality import (
        LOWER_IS_BETTER,
        primary_metric,
        task_of,
        version_quality,
    )

    task = task_of(candidate)
    figures: dict = {"task": task}
    why = waiting = None
    checks = ("min_agreement", "max_abs_diff", "max_mean_abs_diff", "max_distribution_distance")
    if any(getattr(plan, k) is not None for k in checks):
        mirrored = mirror_window(model.name, candidate.number, since)
        figures["agreement"] = {**mirrored, "mirror_percent": plan.mirror_percent,
                                **{k: getattr(plan, k) for k in (*checks, "min_compared")}}
        why = judge(plan, task, mirrored)
        enough = mirrored["compared_rows"] if task == "classifier" and \
            plan.min_agreement is not None else mirrored["compared_values"]
        if enough < plan.min_compared:
            waiting = (f"only {enough} mirrored answers compared with the stable's; the plan "
                       f"needs {plan.min_compared}")
    if plan.max_quality_drop is not None and why is None:
        metric = primary_metric(task)
        ours = version_quality(model, candidate, since=since)
        theirs = version_quality(model, stable, since=since)
        figures["quality"] = {"metric": metric, "candidate": ours, "stable": theirs,
                              "max_quality_drop": plan.max_quality_drop,
                              "min_feedback": plan.min_feedback}
        a, b = ours.get(metric), theirs.get(metric)
        figures["quality"].update(candidate_value=a, stable_value=b)
        if (min(ours["count"], theirs["count"]) >= plan.min_feedback
                and a is not None and b is not None):
            drop = (a - b) if metric in LOWER_IS_BETTER else (b - a)
            figures["quality"]["drop"] = drop
            if drop > plan.max_quality_drop:
                why = (f"candidate {metric} {a:.4g} vs stable {b:.4g} over {ours['count']} / "
                       f"{theirs['count']} labels: worse by {drop:.4g} > "
                       f"{plan.max_quality_drop:g}")
    return {"figures": figures, "why": why, "waiting": waiting}
