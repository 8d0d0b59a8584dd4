"""Webhook deliveries: which audit actions are lifecycle events, the signed JSON sent for each,
and delivery with retries and exponential backoff (background task `registry.deliver_webhook`
on its own lane, so a slow receiver never delays validations).

Events come from one hook point: `registry.audit.record` calls its listeners for every audit
event; `schedule_events` (registered by the app's ready()) fans lifecycle events out to the
matching subscriptions after commit."""

from __future__ import annotations

import json
import logging

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from registry.background import enqueue
from registry.integrations import outbound
from registry.models import (
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
    "version.approve": "version.approved",
    "version.reject": "version.rejected",
    "endpoint.canary": "canary.started",
    "endpoint.promote": "canary.promoted",
    "endpoint.abort": "canary.rolled_back",  # by hand, or the automated analysis' rollback
    "endpoint.rollback": "endpoint.rolled_back",
    "endpoint.switch": "bluegreen.switched",
    "endpoint.switch-back": "bluegreen.switched",
    "version.tensorrt.built": "job.finished",
    "version.tensorrt.failed": "job.finished",
    "version.tensorrt.skipped": "job.finished",
    "monitor.drift": "monitor.drift",  # a drift episode started (registry.services.drift)
}
_JOB_ENDINGS = ("finished", "succeeded", "failed", "cancelled", "completed")
EVENTS = sorted({*ACTION_EVENTS.values(), "ping"})


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
    return outbound.backoff(attempt, base=float(_setting("WEBHOOK_BACKOFF_SECONDS", 1.0)),
                            cap=float(_setting("WEBHOOK_BACKOFF_MAX_SECONDS", 300)))


def send(delivery_id: int, delay: float = 0.0) -> None:
    """Start (or retry after `delay` seconds) a delivery, off the caller's thread."""
    enqueue("registry.deliver_webhook", delay=delay, delivery_id=delivery_id)


def attempt_delivery(delivery_id: int, *, retry: bool = True) -> str:
    """Try a pending delivery once; on failure schedule the next try with backoff until
    max_attempts (a URL the address policy refuses fails at once). The attempt log keeps the
    class of failure only (see outbound.py). Returns the delivery's status afterwards."""
    with transaction.atomic():
        d = WebhookDelivery.objects.select_for_update().select_related("subscription").get(
            pk=delivery_id)
        if d.status != DeliveryStatus.PENDING:
            return d.status
        d.attempts += 1
        d.save(update_fields=["attempts"])
    sub, number, body = d.subscription, d.attempts, d.body.encode()
    sent = outbound.post_signed(sub.url, body, {
        "Content-Type": "application/json", "User-Agent": "mmc-webhooks/1",
        "X-MMC-Event": d.event, "X-MMC-Delivery": str(d.pk),
    }, secret=sub.secret, timeout=float(_setting("WEBHOOK_TIMEOUT_SECONDS", 10.0)))
    code, error, ms, ok = sent.status_code, sent.error, sent.duration_ms, sent.ok
    last = ok or sent.refused or not retry or number >= d.max_attempts
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

