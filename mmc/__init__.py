"""The Python client of the model management console: `from mmc import Client`.

It needs httpx only (no Django, nothing of the server), so a CI job or a notebook can install and
import it on its own."""

from mmc.client import Client
from mmc.errors import (
    BadRequest,
    Conflict,
    ConnectionFailed,
    Forbidden,
    Gone,
    InsufficientStorage,
    MmcError,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ServerError,
    ServiceUnavailable,
    Unauthorized,
    Unprocessable,
    WaitTimeout,
)
from mmc.resources import (
    Alias,
    ApiKey,
    AuditEvent,
    Convergence,
    Dataset,
    Download,
    Endpoint,
    Export,
    Job,
    Me,
    Model,
    Plan,
    ShadowReport,
    Team,
    TeamMember,
    Token,
    User,
    Version,
    Webhook,
    WebhookDelivery,
)

__all__ = [
    "Client",
    "MmcError", "BadRequest", "Unauthorized", "Forbidden", "NotFound", "Conflict", "Gone",
    "PayloadTooLarge", "Unprocessable", "RateLimited", "ServerError", "ServiceUnavailable",
    "InsufficientStorage", "ConnectionFailed", "WaitTimeout",
    "Alias", "ApiKey", "AuditEvent", "Convergence", "Dataset", "Download", "Endpoint", "Export",
    "Job", "Me", "Model", "Plan", "ShadowReport", "Team", "TeamMember", "Token", "User",
    "Version", "Webhook", "WebhookDelivery",
]
