"""Model quality from ground truth: feedback labels joined with what the version answered.

A version is a classifier or a regressor (ModelVersion.task, else inferred from its output
signature: `task_of`). Classifiers are judged by accuracy, macro F1 and AUC (binary, or
one-vs-rest macro over the classes that have both positives and negatives; from ranks, the
Mann-Whitney statistic, via scipy.stats.rankdata); regressors by RMSE and MAE.

`run()` is the periodic job (registry.quality_tick): it joins pending feedback with captured
predictions (registry/monitoring/feedback.py) and stores one QualityPoint per version and
window of prediction time, recomputing every window that got new labels (a late label is
counted on its point and still used)."""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import numpy as np
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from scipy.stats import rankdata

from registry.choices import TaskType
from registry.models import Feedback, FeedbackStatus, ModelVersion, QualityPoint, RegisteredModel

CLASSIFIER_METRICS = ("accuracy", "f1", "auc")
REGRESSOR_METRICS = ("rmse", "mae")
LOWER_IS_BETTER = frozenset(REGRESSOR_METRICS)


def inferred_task(signature: dict) -> str:
    """Classifier when the first output is an integer label or has a class dimension > 1,
    else regressor."""
    outputs = (signature or {}).get("outputs") or []
    if not outputs:
        return TaskType.REGRESSOR
    first = outputs[0]
    if str(first.get("datatype", "")).upper().startswith(("INT", "UINT", "BOOL", "BYTES")):
        return TaskType.CLASSIFIER
    shape = first.get("shape") or []
    last = shape[-1] if shape else 1
    return TaskType.CLASSIFIER if len(shape) >= 2 and isinstance(last, int) and last > 1 \
        else TaskType.REGRESSOR


def task_of(version: ModelVersion) -> str:
    """The version's task as set, else as its signature says."""
    return version.task or inferred_task(version.signature)


def primary_metric(task: str) -> str:
    return "accuracy" if task == TaskType.CLASSIFIER else "rmse"


# ------------------------------------------------------------------------------- the figures


def auc_binary(y: np.ndarray, score: np.ndarray) -> float | None:
    """Area under the ROC curve of `score` for y == 1 (ties count half); None without both
    classes."""
    y = np.asarray(y).astype(bool)
    pos, neg = int(y.sum()), int((~y).sum())
    if pos == 0 or neg == 0:
        return None
    ranks = rankdata(np.asarray(score, dtype=np.float64))
    return float((ranks[y].sum() - pos * (pos + 1) / 2) / (pos * neg))


def classifier_metrics(y: list[int], scores: list[list[float]]) -> dict:
    """accuracy, macro F1 (over the classes seen in labels or answers) and AUC (binary, or
    one-vs-rest macro) of rows of scores against class indexes. A single-column score is a
    probability of class 1."""
    y_true = np.asarray(y, dtype=np.int64)
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim == 1:
        s = s.reshape(-1, 1)
    if not len(y_true):
        return dict.fromkeys(CLASSIFIER_METRICS)
    if s.shape[1] == 1:
        pred = (s[:, 0] >= 0.5).astype(np.int64)
        auc = auc_binary(y_true == 1, s[:, 0])
    else:
        pred = s.argmax(1)
        if s.shape[1] == 2:
            auc = auc_binary(y_true == 1, s[:, 1])
        else:
            per = [auc_binary(y_true == k, s[:, k]) for k in range(s.shape[1])]
            per = [a for a in per if a is not None]
            auc = float(np.mean(per)) if per else None
    f1s = []
    for k in np.union1d(y_true, pred):
        tp = int(np.sum((pred == k) & (y_true == k)))
        fp = int(np.sum((pred == k) & (y_true != k)))
        fn = int(np.sum((pred != k) & (y_true == k)))
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return {"accuracy": float(np.mean(pred == y_true)), "f1": float(np.mean(f1s)), "auc": auc}


def regressor_metrics(y: list[float], predicted: list[float]) -> dict:
    a, b = np.asarray(y, dtype=np.float64), np.asarray(predicted, dtype=np.float64)
    if not a.size:
        return dict.fromkeys(REGRESSOR_METRICS)
    err = b - a
    return {"rmse": float(math.sqrt(np.mean(err ** 2))), "mae": float(np.mean(np.abs(err)))}


def _class_index(label, classes: list | None) -> int | None:
    if isinstance(label, bool):
        return int(label)
    if isinstance(label, int):
        return label
    if isinstance(label, str):
        if classes and label in classes:
            return classes.index(label)
        return int(label) if label.isdigit() else None
    return None


def pairs(task: str, rows: list[Feedback], classes: list | None = None) -> tuple[list, list]:
    """(labels, answers) of joined feedback, one per answered row: a list label pairs with the
    rows of a batched request in order; a label that cannot be read for the task is skipped."""
    labels, answers = [], []
    for fb in rows:
        answer = (fb.prediction or {}).get("rows") or []
        given = fb.label if isinstance(fb.label, list) else [fb.label]
        if task == TaskType.REGRESSOR:
            flat = [v for row in answer for v in (row if isinstance(row, list) else [row])]
            if len(flat) == len(given):
                labels += [float(v) for v in given]
                answers += flat
            continue
        for label, row in zip(given, answer, strict=False):
            index = _class_index(label, classes)
            if index is not None:
                labels.append(index)
                answers.append(row if isinstance(row, list) else [row])
    return labels, answers


def metrics_for(task: str, rows: list[Feedback], classes: list | None = None) -> tuple[dict, int]:
    """The task's figures over joined feedback, and how many labelled rows they count."""
    labels, answers = pairs(task, rows, classes)
    if task == TaskType.REGRESSOR:
        return regressor_metrics(labels, answers), len(labels)
    width = max((len(a) for a in answers), default=0)
    answers = [a + [0.0] * (width - len(a)) for a in answers]
    return classifier_metrics(labels, answers), len(labels)


def version_quality(model: RegisteredModel, version: ModelVersion, *,
                    since: datetime) -> dict:
    """The version's quality over feedback joined for predictions since `since` (the canary
    analysis' quality check): {"task", "count", <metrics>}."""
    task = task_of(version)
    rows = list(Feedback.objects.filter(model=model, version=version.number,
                                        status=FeedbackStatus.JOINED, predicted_at__gte=since))
    figures, count = metrics_for(task, rows, _classes(version))
    return {"task": task, "count": count, **figures}


def _classes(version: ModelVersion) -> list | None:
    classes = (version.metadata or {}).get("classes")
    return classes if isinstance(classes, list) else None


# ---------------------------------------------------------------------------- the periodic job


def window_start(at: datetime, seconds: int) -> datetime:
    stamp = int(at.timestamp()) // seconds * seconds
    return datetime.fromtimestamp(stamp, UTC)


def run(*, now: datetime | None = None) -> dict:
    """Join pending feedback, then (re)compute the quality points of every window with new
    labels. Returns counts for the log: joined, unknown, late, points."""
    from registry.monitoring.feedback import join_pending

    now = now or timezone.now()
    width = settings.QUALITY_WINDOW_SECONDS
    totals = {"joined": 0, "unknown": 0, "late": 0, "points": 0}
    models = RegisteredModel.objects.filter(feedback__status=FeedbackStatus.PENDING).distinct()
    for model in models:
        joined = join_pending(model, now=now)
        totals["joined"] += len(joined)
        totals["unknown"] += Feedback.objects.filter(model=model,
                                                     status=FeedbackStatus.UNKNOWN).count()
        due: dict[int, set[datetime]] = defaultdict(set)
        for fb in joined:
            due[fb.version].add(window_start(fb.predicted_at, width))
        for number, starts in due.items():
            version = model.versions.filter(number=number).first()
            if version is None:
                continue
            for start in sorted(starts):
                late = _compute_point(model, version, start, width, now)
                totals["late"] += late
                totals["points"] += 1
    return totals


def _compute_point(model: RegisteredModel, version: ModelVersion, start: datetime, width: int,
                   now: datetime) -> int:
    """Store one window's point; labels joined into a point computed before they arrived are
    marked late. How many were newly late."""
    end = start + timedelta(seconds=width)
    with transaction.atomic():
        existing = (QualityPoint.objects.select_for_update()
                    .filter(model=model, version=version.number, window_start=start).first())
        rows = list(Feedback.objects.filter(model=model, version=version.number,
                                            status=FeedbackStatus.JOINED,
                                            predicted_at__gte=start, predicted_at__lt=end))
        newly_late = 0
        if existing is not None and existing.computed_at >= end:  # it was final: late
            late_ids = [fb.id for fb in rows
                        if not fb.late and fb.received_at > existing.computed_at]
            newly_late = Feedback.objects.filter(id__in=late_ids).update(late=True)
        task = task_of(version)
        figures, count = metrics_for(task, rows, _classes(version))
        late = sum(1 for fb in rows if fb.late) + newly_late
        QualityPoint.objects.update_or_create(
            model=model, version=version.number, window_start=start,
            defaults={"window_seconds": width, "task": task, "count": count,
                      "metrics": figures, "late": late, "computed_at": now})
    return newly_late


def series(model: RegisteredModel, version: int, *, since: datetime) -> list[dict]:
    """Points for a chart: {"t", "count", "late", <metrics>} oldest first."""
    return [{"t": int(p.window_start.timestamp()), "count": p.count, "late": p.late,
             "task": p.task, **p.metrics}
            for p in QualityPoint.objects.filter(model=model, version=version,
                                                 window_start__gte=since)]


def reference(version: ModelVersion, metric: str) -> float | None:
    """The version's registered evaluation metric of that name (case-insensitive): the chart's
    reference line."""
    for name, value in (version.metrics or {}).items():
        if name.lower() == metric:
            return value
    return None
