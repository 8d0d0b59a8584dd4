"""API tokens (knox) as the API authenticates them: knox checks the digest, the expiry and that
the user is active on every request; we also note when a token was last used."""

from __future__ import annotations

from knox.auth import TokenAuthentication

from registry.services.access import token_touch


class ApiTokenAuthentication(TokenAuthentication):
    def validate_user(self, auth_token):
        user, token = super().validate_user(auth_token)  # refuses an inactive user (401)
        token_touch(token)
        return user, token
