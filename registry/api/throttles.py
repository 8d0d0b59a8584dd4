"""Rate limits shared by the API and the console."""

from __future__ import annotations

from django.conf import settings
from rest_framework.throttling import UserRateThrottle


class TokenCreateThrottle(UserRateThrottle):
    """Token creation per user, at settings.TOKEN_CREATE_RATE ("20/hour"), by the API or the
    console's tokens page: a stolen session or token cannot mint credentials in bulk."""

    scope = "token-create"

    def get_rate(self) -> str:
        return settings.TOKEN_CREATE_RATE
