from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "registry"
    verbose_name = "Model registry"

    def ready(self) -> None:
        # The composition root: background tasks declared, webhooks listening to the audit log.
        from registry import tasks  # noqa: F401
        from registry.audit import listen
        from registry.integrations.webhooks import schedule_events

        listen(schedule_events)
