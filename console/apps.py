from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Console"

    def ready(self) -> None:
        from django.conf import settings

        from console.sso import checks  # noqa: F401  registers the SSO settings checks
        from console.telemetry import start_tracing

        start_tracing(clustered=settings.CLUSTERED)  # OTEL_* on: Django and Celery traced
