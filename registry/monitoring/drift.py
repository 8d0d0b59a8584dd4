"""Drift: each deployed version's recent capture compared with its baseline, feature by feature.

Two measures per feature, both needed to call it drifted (one alone raises too often on many
features): the population stability index on the baseline's own bin edges (or its top-k
categories), above the endpoint's PSI threshold, AND a two-sample test — Kolmogorov–Smirnov
(scipy.stats.ks_2samp) against the baseline's reservoir sample for numeric features,
chi-square on the top-k counts for categorical ones — whose p-value is below the endpoint's
threshold divided by the number of features compared (Bonferroni). A drift *episode* starts at
the first window with a drifted feature and ends at the first window, with enough samples, that
has none; each start and end is one audit event (the start fires the monitor.drift webhook).
"""

from __future__ import annotations

import numpy as np
from scipy import stats as scipy_stats
from scipy.spatial.distance import jensenshannon

from registry.monitoring.stats import as_text, edges_of, feature_columns, psi


def compare_numeric(summary: dict, column: np.ndarray) -> dict:
    values = np.asarray(column, dtype=np.float64)
    values = values[np.isfinite(values)]
    counts = np.histogram(values, bins=edges_of(summary))[0]
    test = scipy_stats.ks_2samp(values, np.asarray(summary["sample"]))
    return {"psi": psi(summary["counts"], counts), "statistic": float(test.statistic),
            "p_value": float(test.pvalue), "n": int(values.size)}


def compare_categorical(summary: dict, column: np.ndarray) -> dict:
    values = as_text(np.asarray(column))
    names = list(summary["top"])
    expected = np.array([summary["top"][k] for k in names] + [summary["other"]], float)
    uniq, counts = np.unique(values, return_counts=True)
    seen = dict(zip(uniq.tolist(), counts.tolist(), strict=True))
    actual = np.array([seen.get(k, 0) for k in names] + [0], float)
    actual[-1] = values.size - actual[:-1].sum()
    keep = expected > 0  # a category the baseline never saw is counted in "other"
    if not keep[-1]:
        actual[np.flatnonzero(keep)[-1] if keep.any() else -1] += actual[-1]
    e, a = expected[keep], actual[keep]
    if e.size < 2 or a.sum() == 0:
        p = 1.0
    else:
        p = float(scipy_stats.chisquare(a, e / e.sum() * a.sum()).pvalue)
    return {"psi": psi(e, a), "statistic": float(jensenshannon(e / e.sum(), a / max(a.sum(), 1))),
            "p_value": p, "n": int(values.size)}


def compare(baseline: dict, arrays: dict[str, dict[str, np.ndarray]], *, psi_threshold: float,
            p_value: float, min_samples: int) -> list[dict]:
    """One result per baseline feature with at least `min_samples` values in `arrays` (part,
    feature, psi, statistic, p_value, n, drifted), the decision corrected for their number."""
    results = []
    for part, features in baseline.items():
        columns = {f: c for name, array in arrays.get(part, {}).items()
                   for f, c, _flat in feature_columns(name, array)}
        for feature, summary in features.items():
            column = columns.get(feature)
            if column is None or column.size < min_samples or not summary.get("count"):
                continue
            measure = compare_numeric if summary["kind"] == "numeric" else compare_categorical
            results.append({"part": part, "feature": feature, **measure(summary, column)})
    bound = p_value / max(len(results), 1)
    for r in results:
        r["drifted"] = bool(r["psi"] > psi_threshold and r["p_value"] < bound)
        if not np.isfinite(r["statistic"]):
            r["statistic"] = 0.0
    return results


def deployed_versions(endpoint) -> list[int]:
    ids = {endpoint.stable_id, endpoint.candidate_id, endpoint.blue_id, endpoint.green_id,
           endpoint.shadow_id} - {None}
    return sorted(ids)


def recent_episodes(model, limit: int = 20) -> list:
    from registry.models import DriftEpisode

    return list(DriftEpisode.objects.filter(model=model).order_by("-started_at")[:limit])


def latest_points(model) -> list:
    """Each version's points of its most recent compared window."""
    from django.db.models import Max

    from registry.models import DriftPoint

    ends = DriftPoint.objects.filter(model=model).values("version").annotate(end=Max("window_end"))
    points = []
    for row in ends:
        points.extend(DriftPoint.objects.filter(model=model, version=row["version"],
                                                window_end=row["end"]))
    return points


def points_between(model, *, since, until) -> list:
    from registry.models import DriftPoint

    return list(DriftPoint.objects.filter(model=model, window_end__gte=since,
                                          window_end__lte=until)
                .order_by("version", "feature", "window_end"))
