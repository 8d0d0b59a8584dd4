"""Ground truth for answered requests: feedback labels by request id, and their join with what
the version that answered said (the captured record, registry/monitoring/capture_store.py).

Rules, as the API documents them:
- A body is one `{"request_id", "label"}` or `{"feedback": [...]}` of at most
  MMC_FEEDBACK_MAX_BATCH; a wrong type anywhere refuses the whole body (400 naming the field,
  e.g. "feedback[3].label") and nothing is written.
- Duplicates: the first label of a request id is kept; a later one (in the same body or after)
  only adds to its `duplicates` count.
- Unknown request ids (no captured record at join time) are counted, never errors: the join is
  tried again on each run until the feedback is MMC_FEEDBACK_LOOKBACK_SECONDS old.
- Late labels (joined into a quality window already computed after it closed) are counted on
  that window's point and the point is computed again with them (registry/monitoring/quality.py).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, Min, Q, Sum
from django.utils import timezone

from registry.errors import InvalidRequest
from registry.models import Feedback, FeedbackStatus, RegisteredModel
from registry.monitoring import capture_store

MAX_REQUEST_ID = 128
MAX_LABEL_VALUES = 1024
MAX_ROWS_KEPT = 64  # answer rows kept per joined request (a label per row at most)


def _label(value, where: str):
    """A class index or name, a number, or a list of those (one per row of the request)."""
    def one(v) -> bool:
        if isinstance(v, bool):
            return False
        if isinstance(v, int):
            return True
        if isinstance(v, float):
            return math.isfinite(v)
        return isinstance(v, str) and 0 < len(v) <= 200

    if isinstance(value, list):
        if not value or len(value) > MAX_LABEL_VALUES or not all(one(v) for v in value):
            raise InvalidRequest(f"{where} must be a non-empty list of at most "
                                 f"{MAX_LABEL_VALUES} class indexes, class names or numbers",
                                 field=where)
        return value
    if not one(value):
        raise InvalidRequest(f"{where} must be a class index, a class name or a finite number "
                             f"(or a list of them)", field=where)
    return value


def clean(body) -> list[tuple[str, object]]:
    """(request_id, label) pairs from a request body, or InvalidRequest naming the field."""
    if not isinstance(body, dict):
        raise InvalidRequest('the body must be an object: {"request_id", "label"} or '
                             '{"feedback": [...]}', field="feedback")
    if "feedback" in body:
        items, prefix = body["feedback"], "feedback"
        if set(body) - {"feedback"}:
            raise InvalidRequest("a batch body has only the field feedback", field="feedback")
        if not isinstance(items, list) or not items:
            raise InvalidRequest("feedback must be a non-empty list", field="feedback")
        limit = settings.FEEDBACK_MAX_BATCH
        if len(items) > limit:
            raise InvalidRequest(f"feedback has {len(items)} items; at most {limit} per request "
                                 "(MMC_FEEDBACK_MAX_BATCH)", field="feedback")
    else:
        items, prefix = [body], ""
    out = []
    for i, item in enumerate(items):
        at = f"{prefix}[{i}]." if prefix else ""
        if not isinstance(item, dict):
            raise InvalidRequest(f"{prefix}[{i}] must be an object with request_id and label",
                                 field=f"{prefix}[{i}]")
        unknown = set(item) - {"request_id", "label"}
        if unknown:
            raise InvalidRequest(f"{at}{sorted(unknown)[0]} is not a feedback field (request_id, "
                                 f"label)", field=f"{at}{sorted(unknown)[0]}")
        rid = item.get("request_id")
        if not isinstance(rid, str) or not 0 < len(rid) <= MAX_REQUEST_ID:
            raise InvalidRequest(f"{at}request_id must be a string of 1-{MAX_REQUEST_ID} "
                                 "characters", field=f"{at}request_id")
        if "label" not in item:
            raise InvalidRequest(f"{at}label is required", field=f"{at}label")
        out.append((rid, _label(item["label"], f"{at}label")))
    return out


def record(*, model: RegisteredModel, items: list[tuple[str, object]],
           now: datetime | None = None) -> dict:
    """Store cleaned feedback in one transaction: how many were accepted (new request ids) and
    how many were duplicates (the first label kept)."""
    now = now or timezone.now()
    first: dict[str, object] = {}
    repeated: dict[str, int] = {}
    for rid, label in items:
        if rid in first:
            repeated[rid] = repeated.get(rid, 0) + 1
        else:
            first[rid] = label
    with transaction.atomic():
        known = set(Feedback.objects.filter(model=model, request_id__in=list(first))
                    .values_list("request_id", flat=True))
        for rid in known:
            repeated[rid] = repeated.get(rid, 0) + 1
        Feedback.objects.bulk_create([
            Feedback(model=model, request_id=rid, label=label, received_at=now)
            for rid, label in first.items() if rid not in known])
        for rid, extra in repeated.items():
            Feedback.objects.filter(model=model, request_id=rid).update(
                duplicates=F("duplicates") + extra)
    return {"accepted": len(first) - len(known), "duplicate": sum(repeated.values())}


def _answer(record: dict) -> dict | None:
    """The first output of a captured record as rows (kept small)."""
    outputs = record.get("outputs") or {}
    for name, tensor in outputs.items():
        data, shape = tensor.get("data") or [], tensor.get("shape") or [len(tensor.get("data", []))]
        width = 1
        for d in shape[1:]:
            width *= d
        width = max(width, 1)
        rows = [data[i:i + width] if width > 1 else data[i]
                for i in range(0, min(len(data), width * MAX_ROWS_KEPT), width)]
        return {"output": name, "rows": rows}
    return None


def join_pending(model: RegisteredModel, *, now: datetime | None = None) -> list[Feedback]:
    """Join the model's pending (and still young unknown) feedback with captured records by
    request id, reading the capture once. The rows joined now."""
    now = now or timezone.now()
    lookback = timedelta(seconds=settings.FEEDBACK_LOOKBACK_SECONDS)
    waiting = Feedback.objects.filter(model=model).filter(
        Q(status=FeedbackStatus.PENDING)
        | Q(status=FeedbackStatus.UNKNOWN, received_at__gte=now - lookback))
    oldest = waiting.aggregate(t=Min("received_at"))["t"]
    if oldest is None:
        return []
    wanted = {fb.request_id: fb for fb in waiting}
    found: dict[str, dict] = {}
    for rec in capture_store.iter_records(model.name, since=(oldest - lookback).timestamp(),
                                          until=now.timestamp()):
        rid = rec.get("id")
        if rid in wanted and rec.get("role") not in ("shadow", "mirror"):
            found[rid] = rec  # the newest (files are read oldest first)
    joined = []
    with transaction.atomic():
        for rid, fb in wanted.items():
            rec = found.get(rid)
            if rec is None:
                if fb.status == FeedbackStatus.PENDING:
                    fb.status = FeedbackStatus.UNKNOWN
                    fb.save(update_fields=["status"])
                continue
            fb.status = FeedbackStatus.JOINED
            fb.version = rec.get("version")
            fb.role = rec.get("role") or ""
            fb.predicted_at = datetime.fromtimestamp(rec["ts"], UTC)
            fb.prediction = _answer(rec)
            fb.save(update_fields=["status", "version", "role", "predicted_at", "prediction"])
            joined.append(fb)
    return joined


def counts(model: RegisteredModel) -> dict:
    """Received, joined, pending, unknown, late and duplicate labels of the model."""
    agg = Feedback.objects.filter(model=model).aggregate(
        received=Count("id"), duplicates=Sum("duplicates"),
        joined=Count("id", filter=Q(status=FeedbackStatus.JOINED)),
        pending=Count("id", filter=Q(status=FeedbackStatus.PENDING)),
        unknown=Count("id", filter=Q(status=FeedbackStatus.UNKNOWN)),
        late=Count("id", filter=Q(late=True)))
    agg["duplicates"] = agg["duplicates"] or 0
    return agg
