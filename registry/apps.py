from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "registry"
    verbose_name = "Model registry"

    def ready(self) -> None:
        # The composition root: background tasks declared, webhooks listening to the audit log,
        # login lockouts (django-axes) written to the audit log.
        from axes.signals import user_locked_out

        from registry import tasks  # noqa: F401
        from registry.audit import listen
        from registry.integrations.webhooks import schedule_events
        from registry.services.lockouts import audit_lockout

        listen(schedule_events)
        user_locked_out.connect(audit_lockout, dispatch_uid="registry.audit_lockout")
