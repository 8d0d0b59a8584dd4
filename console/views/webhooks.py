"""Webhooks (admin only): subscribe a URL to events, see the secret once, enable or disable,
send a test ping and read the delivery log. Every change is the API's registry service."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from registry.integrations.webhooks import EVENTS
from registry.models import WebhookSubscription
from registry.services import webhooks as hooks

from ..forms import WebhookForm
from .access import requires, run_service

DELIVERIES_SHOWN = 50


def _render(request: HttpRequest, form: WebhookForm, *, created=None,
            status: int = 200) -> HttpResponse:
    subs = WebhookSubscription.objects.select_related("model").order_by("id")
    context = {"form": form, "created": created, "webhooks": subs, "nav": "webhooks"}
    response = render(request, "console/webhooks.html", context, status=status)
    if created:
        response["Cache-Control"] = "no-store"  # the secret must not sit in a cache
    return response


@requires("admin", write="admin")
def webhook_page(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return _render(request, WebhookForm(events=EVENTS))
    form = WebhookForm(request.POST, events=EVENTS)
    if not form.is_valid():
        return _render(request, form, status=400)
    sub = run_service(request, hooks.webhook_create, url=form.cleaned_data["url"],
                      name=form.cleaned_data["name"], model=form.cleaned_data["model"] or None,
                      events=form.cleaned_data["events"],
                      success="Webhook created. Copy its secret now: it is not shown again.")
    if sub is None:
        return _render(request, form, status=400)
    return _render(request, WebhookForm(events=EVENTS), created=sub)


@require_POST
@requires("admin", write="admin")
def webhook_active(request: HttpRequest, pk: int, active: bool) -> HttpResponse:
    run_service(request, hooks.webhook_update, webhook_id=pk, active=active,
                success=f"Webhook {pk} {'enabled' if active else 'disabled: no events are sent'}.")
    return redirect("console:webhooks")


@require_POST
@requires("admin", write="admin")
def webhook_delete(request: HttpRequest, pk: int) -> HttpResponse:
    run_service(request, hooks.webhook_delete, webhook_id=pk,
                success=f"Webhook {pk} and its delivery log deleted.")
    return redirect("console:webhooks")


@require_POST
@requires("admin", write="admin")
def webhook_test(request: HttpRequest, pk: int) -> HttpResponse:
    """Send a ping now, once; the page then shows how the receiver answered."""
    from django.contrib import messages

    delivery = run_service(request, hooks.webhook_test, webhook_id=pk)
    if delivery is not None:
        attempt = delivery.attempt_log.order_by("-number").first()
        if delivery.status == "succeeded":
            messages.success(request, f"Test delivered: the receiver answered HTTP "
                                      f"{delivery.last_status_code}.")
        else:
            why = (f"HTTP {delivery.last_status_code}" if delivery.last_status_code
                   else delivery.last_error or (attempt.error if attempt else "no answer"))
            messages.error(request, f"Test not delivered: {why}.")
    return redirect("console:webhook-detail", pk=pk)


@requires("admin", write="admin")
def webhook_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """The delivery log, and the form that edits the URL, model and events (audited by the
    same service as PATCH /api/v1/webhooks/{id}/)."""
    sub = get_object_or_404(WebhookSubscription.objects.select_related("model"), pk=pk)
    status = 200
    if request.method == "POST":
        form = WebhookForm(request.POST, events=EVENTS)
        if form.is_valid():
            data = form.cleaned_data
            done = run_service(request, hooks.webhook_update, webhook_id=pk, url=data["url"],
                               name=data["name"], model=data["model"] or None,
                               events=data["events"], success=f"Webhook {pk} saved.")
            if done is not None:
                return redirect("console:webhook-detail", pk=pk)
        status = 400
    else:
        form = WebhookForm(events=EVENTS, initial={
            "name": sub.name, "url": sub.url, "model": sub.model.name if sub.model else "",
            "events": sub.events})
    deliveries = sub.deliveries.prefetch_related("attempt_log")[:DELIVERIES_SHOWN]
    return render(request, "console/webhook_detail.html",
                  {"sub": sub, "deliveries": deliveries, "nav": "webhooks", "form": form},
                  status=status)
