"""Evaluation metrics and lineage of a version: what is valid, which direction is better, the
per-metric best across versions, and the `?metric=` / `?metadata=` filter syntax.

Metrics are `name -> finite number`. Lower is better when the name (case-insensitive) ends in
one of LOWER_SUFFIXES or contains one of LOWER_WORDS (`latency_p99_ms`, `val_loss`,
`error_rate`, `rmse`); every other metric is higher-better (`auc`, `accuracy`, `f1`).

Filters: `metric=NAME OP NUMBER` with OP one of `>=`, `<=`, `!=`, `>`, `<`, `=`
(`?metric=auc>0.9`); `metadata=KEY:VALUE` (`?metadata=team:ml`). Each may repeat; all must hold.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator

from registry.errors import InvalidRequest

METRIC_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
METRIC_NAME_RULE = "1-64 letters, digits, '_', '.' or '-', starting with a letter"
MAX_METRICS = 64
LINEAGE_KEYS = ("run_url", "git_commit", "dataset")
GIT_COMMIT = re.compile(r"^[0-9a-f]{7,64}$")
LOWER_SUFFIXES = ("_ms", "_us", "_s", "_seconds", "_bytes")
LOWER_WORDS = ("latency", "loss", "error", "mse", "mae", "rmse", "perplexity", "wer")


def lower_is_better(name: str) -> bool:
    """The documented direction rule (see the module docstring)."""
    low = name.lower()
    return low.endswith(LOWER_SUFFIXES) or any(word in low for word in LOWER_WORDS)


def metric_value(name: str, value) -> float:
    """`value` as a finite float, or InvalidRequest naming the metric."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"metric {name!r} must be a number, not {value!r}", field="metrics")
    if not math.isfinite(value):
        raise InvalidRequest(f"metric {name!r} must be a finite number, not {value!r}",
                             field="metrics")
    return float(value) if isinstance(value, float) else value


def clean_metrics(raw) -> dict:
    """A validated `name -> number` object (the whole set a version carries)."""
    if not isinstance(raw, dict):
        raise InvalidRequest('metrics must be a JSON object of name -> number, e.g. '
                             '{"auc": 0.91}', field="metrics")
    if len(raw) > MAX_METRICS:
        raise InvalidRequest(f"at most {MAX_METRICS} metrics per version", field="metrics")
    for name in raw:
        if not METRIC_NAME.match(name):
            raise InvalidRequest(f"metric name {name!r} is invalid: use {METRIC_NAME_RULE}",
                                 field="metrics")
    return {name: metric_value(name, value) for name, value in raw.items()}


def clean_lineage(raw) -> dict:
    """Validated lineage: `run_url` (http/https URL), `git_commit` (7-64 hex), `dataset`."""
    if not isinstance(raw, dict):
        raise InvalidRequest("lineage must be a JSON object with run_url, git_commit, dataset",
                             field="lineage")
    unknown = set(raw) - set(LINEAGE_KEYS)
    if unknown:
        raise InvalidRequest(f"unknown lineage field(s): {', '.join(sorted(unknown))} (known: "
                             f"{', '.join(LINEAGE_KEYS)})", field="lineage")
    out = {}
    for key, value in raw.items():
        if value in (None, ""):
            continue
        if not isinstance(value, str):
            raise InvalidRequest(f"lineage {key} must be a string", field="lineage")
        value = value.strip()
        if key == "run_url":
            try:
                URLValidator(schemes=["http", "https"])(value)
            except ValidationError:
                raise InvalidRequest(f"lineage run_url {value[:100]!r} is not an http(s) URL",
                                     field="lineage") from None
            if len(value) > 500:
                raise InvalidRequest("lineage run_url is longer than 500 characters",
                                     field="lineage")
        elif key == "git_commit":
            value = value.lower()
            if not GIT_COMMIT.match(value):
                raise InvalidRequest(f"lineage git_commit {value[:80]!r} is not a commit hash "
                                     "(7-64 hexadecimal digits)", field="lineage")
        elif len(value) > 200:
            raise InvalidRequest("lineage dataset is longer than 200 characters",
                                 field="lineage")
        out[key] = value
    return out


def merge_patch(current: dict, patch: dict) -> dict:
    """RFC 7396 on one level: a key set to null is removed, any other value replaces."""
    merged = dict(current)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


# -- the table across versions --------------------------------------------------------------


@dataclass(frozen=True)
class MetricColumn:
    name: str
    lower_better: bool
    best: float | None


def metric_columns(versions) -> list[MetricColumn]:
    """One column per metric name any of `versions` carries, with its best value."""
    values: dict[str, list[float]] = {}
    for v in versions:
        for name, value in (v.metrics or {}).items():
            values.setdefault(name, []).append(value)
    columns = []
    for name in sorted(values, key=str.lower):
        lower = lower_is_better(name)
        columns.append(MetricColumn(name, lower, (min if lower else max)(values[name])))
    return columns


def metric_rows(versions, columns: list[MetricColumn]) -> list[dict]:
    """Per version, one cell per column: value (None when missing) and whether it is the best."""
    rows = []
    for v in versions:
        metrics = v.metrics or {}
        cells = [{"value": metrics.get(c.name),
                  "best": metrics.get(c.name) is not None and len(versions) > 1
                  and metrics[c.name] == c.best}
                 for c in columns]
        rows.append({"version": v, "cells": cells})
    return rows


def metric_diff(a: dict, b: dict) -> list[dict]:
    """A vs B per metric: both values, B - A, and whether B is better, worse or the same."""
    rows = []
    for name in sorted(set(a) | set(b), key=str.lower):
        va, vb = a.get(name), b.get(name)
        if va is None or vb is None:
            change, delta = ("only in B" if va is None else "only in A"), None
        else:
            delta = vb - va
            if delta == 0:
                change = "same"
            else:
                better = delta < 0 if lower_is_better(name) else delta > 0
                change = "better" if better else "worse"
        rows.append({"key": name, "a": va, "b": vb, "delta": delta, "change": change,
                     "direction": "lower" if lower_is_better(name) else "higher"})
    return rows


# -- filters -------------------------------------------------------------------------------

CONDITION = re.compile(r"^\s*([A-Za-z][A-Za-z0-9_.-]{0,63})\s*(>=|<=|!=|>|<|=)\s*(\S+)\s*$")
LOOKUPS = {">": "gt", ">=": "gte", "<": "lt", "<=": "lte", "=": "exact", "!=": "exact"}


@dataclass(frozen=True)
class MetricCondition:
    name: str
    op: str
    value: float


def parse_metric_condition(text: str) -> MetricCondition:
    """`auc>0.9` -> MetricCondition; ValueError with the syntax when it is not one."""
    match = CONDITION.match(text or "")
    if not match:
        raise ValueError(f"{text!r} is not NAME OP NUMBER with OP one of >=, <=, !=, >, <, = "
                         "(e.g. auc>0.9)")
    name, op, raw = match.groups()
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"{raw!r} in {text!r} is not a finite number")
    return MetricCondition(name, op, value)


def parse_metadata_condition(text: str) -> tuple[str, str]:
    """`team:ml` -> ("team", "ml"); ValueError when there is no `:` or no key."""
    key, sep, value = (text or "").partition(":")
    if not sep or not key.strip():
        raise ValueError(f"{text!r} is not KEY:VALUE (e.g. team:ml)")
    return key.strip(), value.strip()
