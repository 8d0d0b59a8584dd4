"""Deployments as code: mmc.yaml, a file that says what the registry should look like (models,
aliases, serving settings, endpoints, webhooks), planned and applied through the registry's own
audited services (docs/guide/as-code.md)."""

from registry.services.as_code.apply import APPLY, REFUSED, Outcome, config_apply, config_plan
from registry.services.as_code.document import schema, text_sha256
from registry.services.as_code.state import export_text

__all__ = ["APPLY", "REFUSED", "Outcome", "config_apply", "config_plan", "export_text", "schema",
           "text_sha256"]
