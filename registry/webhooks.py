"""Webhook deliveries: which audit actions are lifecycle events, the signed JSON sent for each,
and delivery with retries and exponential backoff (a Celery task with a countdown when clustered,
a small thread pool with timers when embedded, so a slow receiver never delays validations).

Events come from one hook point: `registry.audit.record` calls `schedule_events` for every audit
event, which after commit fans the event out to the matching subscriptions."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from celery import shared_task
from django.conf import settings
from django.db import close_old_connections, transaction
from django.db.models import Q
from django.utils import timezone

from .models import (
    AuditEvent,
    DeliveryStatus,
    WebhookAttempt,
    WebhookDelivery,
    WebhookSubscription,
)

log = logging.getLogger(__name__)

# audit action -> event name. Job actions are matched by pattern (see event_for).
ACTION_EVENTS = {
    "version.ready": "version.ready",
    "version.failed": "version.failed",
    "endpoint.canary": "canary.started",
    "endpoint.promote": "canary.promoted",
    "endpoint.abort": "canary.rolled_back",  # by hand, or the automated analysis' rollback
    "endpoint.rollback": "endpoint.rolled_back",
    "endpoint.switch": "bluegreen.switched",
    "endpoint.switch-back": "bluegreen.switched",
    "version.tensorrt.built": "job.finished",
    "version.tensorrt.failed": "job.finished",
    "version.tensorrt.skipped": "job.finished",
}
_JOB_ENDINGS = ("finished", "succeeded", "failed", "cancelled", "completed")
EVENTS = sorted({*ACTION_EVENTS.values(), "ping"})
SIGNATURE_HEADER = "X-MMC-Signature"

_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _setting(name: str, default):
    return getattr(settings, name, default)


def event_for(action: str, after: dict | None = None) -> str | None:
    """The webhook event an audit action stands for, or None when it is not one."""
    if action.startswith("job.") and action.rsplit(".", 1)[-1] in _JOB_ENDINGS:
        return "job.finished"
    event = ACTION_EVENTS.get(action)
    if event == "endpoint.rolled_back" and (after or {}).get("state") == "unloading":
        return None  # first half of an unload-first rollback; the second half is the event
    return event


def sign(secret: str, body: bytes) -> str:
    """The X-MMC-Signature value: sha256=<hex HMAC-SHA256 of the raw body>."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _version_of(ev: AuditEvent) -> int | None:
    if ev.target_type == "version":
        tail = ev.target.rsplit(":", 1)[-1]
        return int(tail) if tail.isdigit() else None
    after = ev.after or {}
    if isinstance(after.get("version"), int):
        return after["version"]
    if ev.action == "endpoint.canary":
        return after.get("candidate")
    if after.get("live_color") in ("blue", "green"):
        return after.get(after["live_color"])
    return after.get("stable")


def payload(ev: AuditEvent, event: str) -> dict:
    return {
        "event": event, "action": ev.action, "model": ev.model_name or None,
        "version": _version_of(ev), "actor": ev.actor_name,
        "time": ev.created_at.isoformat(), "target": ev.target, "reason": ev.reason,
        "before": ev.before, "after": ev.after, "audit_event": ev.pk,
    }


def encode(data: dict) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)


def schedule_events(ev: AuditEvent) -> None:
    """Called by audit.record inside the mutation's transaction: fan out after commit, never for
    a change that rolled back."""
    event = event_for(ev.action, ev.after)
    if event is None:
        return

    def fan_out() -> None:
        try:
            dispatch(ev, event)
        except Exception:  # a webhook problem must never fail the change that committed
            log.exception("webhook dispatch for audit event %s failed", ev.pk)

    transaction.on_commit(fan_out)


def subscriptions_for(model_name: str, event: str):
    scope = Q(model__isnull=True)
    if model_name:
        scope |= Q(model__name=model_name)
    return [s for s in WebhookSubscription.objects.filter(scope, active=True)
            if not s.events or event in s.events]


def dispatch(ev: AuditEvent, event: str) -> list[int]:
    """Create one delivery per matching subscription and send each after commit."""
    subs = subscriptions_for(ev.model_name, event)
    if not subs:
        return []
    body = encode(payload(ev, event))
    with transaction.atomic():
        ids = [WebhookDelivery.objects.create(
            subscription=s, event=event, audit_event=ev, body=body,
            max_attempts=_setting("WEBHOOK_MAX_ATTEMPTS", 5)).pk for s in subs]
        transaction.on_commit(lambda: [send(pk) for pk in ids])
    return ids


def backoff(attempt: int) -> float:
    """Seconds before retry number `attempt` + 1: base, 2·base, 4·base... capped."""
    base = float(_setting("WEBHOOK_BACKOFF_SECONDS", 1.0))
    return min(base * 2 ** (attempt - 1), float(_setting("WEBHOOK_BACKOFF_MAX_SECONDS", 300)))


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="mmc-webhook")
        return _executor


def _run_in_process(delivery_id: int) -> None:
    close_old_connections()
    try:
        attempt_delivery(delivery_id)
    except Exception:
        log.exception("webhook delivery %s crashed", delivery_id)
    finally:
        close_old_connections()


def send(delivery_id: int, delay: float = 0.0) -> None:
    """Start (or retry after `delay` seconds) a delivery, off the caller's thread."""
    if settings.CLUSTERED:
        deliver_webhook_task.apply_async(kwargs={"delivery_id": delivery_id},
                                         countdown=delay or None)
    elif delay > 0:
        timer = threading.Timer(delay, lambda: _pool().submit(_run_in_process, delivery_id))
        timer.daemon = True
        timer.start()
    else:
        _pool().submit(_run_in_process, delivery_id)


def post(url: str, body: bytes, headers: dict) -> tuple[int | None, str, float]:
    """One HTTP POST: (status code or None, error, duration in ms)."""
    started = time.perf_counter()
    try:
        r = httpx.post(url, content=body, headers=headers,
                       timeout=float(_setting("WEBHOOK_TIMEOUT_SECONDS", 10.0)))
        code, error = r.status_code, ("" if r.is_success else f"HTTP {r.status_code}: "
                                      f"{r.text[:200]}")
    except httpx.HTTPError as exc:
        code, error = None, f"{exc.__class__.__name__}: {exc}"[:500]
    return code, error, round((time.perf_counter() - started) * 1000, 2)


def attempt_delivery(delivery_id: int, *, retry: bool = True) -> str:
    """Try a pending delivery once; on failure schedule the next try with backoff until
    max_attempts. Returns the delivery's status afterwards."""
    with transaction.atomic():
        d = WebhookDelivery.objects.select_for_update().select_related("subscription").get(
            pk=delivery_id)
        if d.status != DeliveryStatus.PENDING:
            return d.status
        d.attempts += 1
        d.save(update_fields=["attempts"])
    sub, number, body = d.subscription, d.attempts, d.body.encode()
    code, error, ms = post(sub.url, body, {
        "Content-Type": "application/json", "User-Agent": "mmc-webhooks/1",
        "X-MMC-Event": d.event, "X-MMC-Delivery": str(d.pk),
        SIGNATURE_HEADER: sign(sub.secret, body),
    })
    ok = code is not None and 200 <= code < 300
    last = ok or not retry or number >= d.max_attempts
    with transaction.atomic():
        WebhookAttempt.objects.create(delivery=d, number=number, status_code=code, error=error,
                                      duration_ms=ms)
        d.last_status_code, d.last_error = code, error
        if last:
            d.status = DeliveryStatus.SUCCEEDED if ok else DeliveryStatus.FAILED
            d.finished_at = timezone.now()
        d.save(update_fields=["last_status_code", "last_error", "status", "finished_at"])
    if not last:
        send(d.pk, backoff(number))
    return d.status


@shared_task(name="registry.deliver_webhook", acks_late=True)
def deliver_webhook_task(delivery_id: int) -> str:
    return attempt_delivery(delivery_id)
