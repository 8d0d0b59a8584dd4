"""Django admin for what the console leaves to it: users, groups (roles), API tokens, and
read-only views of the audit log and of webhook subscriptions with their delivery log."""

from django.contrib import admin

from registry.models import (
    ApiToken,
    AuditEvent,
    WebhookAttempt,
    WebhookDelivery,
    WebhookSubscription,
)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "token_key", "read_only", "created", "last_used_at", "expiry")
    list_filter = ("user", "read_only")
    search_fields = ("name", "user__username", "token_key")
    readonly_fields = ("digest", "token_key", "created", "last_used_at")
    fields = ("name", "user", "read_only", "expiry", "token_key", "digest", "created",
              "last_used_at")

    def has_add_permission(self, request) -> bool:  # the raw token is only shown by the API/CLI
        return False


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ("created_at", "actor_name", "action", "target", "model_name")
    list_filter = ("action", "target_type")
    search_fields = ("actor_name", "target", "model_name", "action")
    date_hierarchy = "created_at"

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class _ReadOnly(admin.ModelAdmin):
    """Webhooks change through the API (audited); the admin shows them and the delivery log."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(WebhookSubscription)
class WebhookSubscriptionAdmin(_ReadOnly):
    list_display = ("id", "name", "url", "model", "events", "active", "created_at")
    list_filter = ("active",)
    search_fields = ("name", "url", "model__name")
    exclude = ("secret",)


class WebhookAttemptInline(admin.TabularInline):
    model = WebhookAttempt
    fields = ("number", "status_code", "error", "duration_ms", "at")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(_ReadOnly):
    list_display = ("id", "subscription", "event", "status", "attempts", "last_status_code",
                    "created_at", "finished_at")
    list_filter = ("status", "event")
    search_fields = ("subscription__url", "event", "last_error")
    date_hierarchy = "created_at"
    inlines = [WebhookAttemptInline]
