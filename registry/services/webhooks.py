"""Webhook subscriptions (admin only): create, change, delete, send a test. Each is audited; the
secret never appears in the audit log. A URL must point to a public address (or one the
operator's MMC_OUTBOUND_ALLOW names): checked here and again before every delivery."""

from __future__ import annotations

import secrets

from django.db import transaction
from django.utils import timezone

from registry.audit import Actor, record
from registry.errors import InvalidRequest, NotFound
from registry.integrations.addresses import refusal
from registry.integrations.webhooks import EVENTS, attempt_delivery, encode
from registry.models import RegisteredModel, WebhookDelivery, WebhookSubscription

FIELDS = ("name", "url", "model", "events", "active", "secret")


def _snapshot(sub: WebhookSubscription) -> dict:
    return {"name": sub.name, "url": sub.url, "model": sub.model.name if sub.model else None,
            "events": sub.events, "active": sub.active}


def _clean(changes: dict) -> dict:
    out = dict(changes)
    if "url" in out:
        problem = refusal(out["url"] or "")
        if problem:
            raise InvalidRequest(f"url {problem}", field="url")
    if "events" in out:
        events = out["events"] or []
        if not isinstance(events, list) or not all(isinstance(e, str) for e in events):
            raise InvalidRequest("events must be a list of event names", field="events")
        unknown = sorted(set(events) - set(EVENTS))
        if unknown:
            raise InvalidRequest(f"unknown event(s) {', '.join(unknown)}; known: "
                                 f"{', '.join(EVENTS)}", field="events")
        out["events"] = sorted(set(events))
    if "model" in out:
        name = out["model"]
        if name in (None, ""):
            out["model"] = None
        else:
            model = RegisteredModel.objects.filter(name=name).first()
            if model is None:
                raise NotFound(f"no model {name!r}", field="model")
            out["model"] = model
    if "secret" in out and (not out["secret"] or len(out["secret"]) < 16
                            or len(out["secret"]) > 200):
        raise InvalidRequest("secret must be 16-200 characters", field="secret")
    return out


def _locked(webhook_id: int) -> WebhookSubscription:
    sub = (WebhookSubscription.objects.select_for_update(of=("self",))
           .select_related("model").filter(pk=webhook_id).first())
    if sub is None:
        raise NotFound(f"no webhook {webhook_id}", field="webhook")
    return sub


def webhook_create(*, url: str, actor: Actor, model: str | None = None,
                   events: list[str] | None = None, name: str = "", active: bool = True,
                   secret: str | None = None) -> WebhookSubscription:
    """Subscribe `url` to events of one model (or every model). Without a secret one is made;
    the caller shows it once."""
    data = _clean({"url": url, "model": model, "events": events or [], "name": name,
                   "active": active, "secret": secret or secrets.token_hex(32)})
    with transaction.atomic():
        sub = WebhookSubscription.objects.create(created_by=actor.user, **data)
        record(actor, "webhook.create", target_type="webhook", target=str(sub.pk),
               model_name=sub.model.name if sub.model else "", after=_snapshot(sub))
    return sub


def webhook_update(*, webhook_id: int, actor: Actor, **changes) -> WebhookSubscription:
    unknown = set(changes) - set(FIELDS)
    if unknown:
        raise InvalidRequest(f"unknown field(s): {', '.join(sorted(unknown))}",
                             field=sorted(unknown)[0])
    data = _clean(changes)
    with transaction.atomic():
        sub = _locked(webhook_id)
        before = _snapshot(sub)
        for key, value in data.items():
            setattr(sub, key, value)
        sub.save()
        after = _snapshot(sub)
        if "secret" in data:
            after["secret"] = "rotated"
        record(actor, "webhook.update", target_type="webhook", target=str(sub.pk),
               model_name=sub.model.name if sub.model else "", before=before, after=after)
    return sub


def webhook_delete(*, webhook_id: int, actor: Actor) -> None:
    """Remove a subscription and its delivery log."""
    with transaction.atomic():
        sub = _locked(webhook_id)
        before = _snapshot(sub)
        sub.delete()
        record(actor, "webhook.delete", target_type="webhook", target=str(webhook_id),
               model_name=before["model"] or "", before=before)


def webhook_test(*, webhook_id: int, actor: Actor) -> WebhookDelivery:
    """Send a `ping` event to the subscription now, once, whatever its filters; the answer is
    in the returned delivery (and its log)."""
    with transaction.atomic():
        sub = _locked(webhook_id)
        body = encode({"event": "ping", "action": "webhook.test", "model": (
            sub.model.name if sub.model else None), "version": None, "actor": actor.name,
            "time": timezone.now().isoformat(), "target": str(sub.pk), "reason": "",
            "before": None, "after": None, "audit_event": None})
        delivery = WebhookDelivery.objects.create(subscription=sub, event="ping", body=body,
                                                  max_attempts=1)
        record(actor, "webhook.test", target_type="webhook", target=str(sub.pk),
               model_name=sub.model.name if sub.model else "", after={"delivery": delivery.pk})
    attempt_delivery(delivery.pk, retry=False)
    delivery.refresh_from_db()
    return delivery
