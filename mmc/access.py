"""Who is calling: a password login that answers a token, whoami, logout; API tokens, users
(admin) and the audit log (admin)."""

from __future__ import annotations

import re
import socket
from itertools import islice
from typing import Any

from mmc.resources import AuditEvent, Me, Token, User
from mmc.transport import Transport


def client_name(kind: str = "mmc-python") -> str:
    """A login token's name on the server: what asked for it, on which machine."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname() or "unknown") or "unknown"
    return f"{kind}@{host}"[:100]


class Access(Transport):
    def login(self, username: str, password: str, *, client: str | None = None) -> Token:
        """Trade a password for a new API token (named `client`, default
        mmc-python@<hostname>), which this client then uses. The request carries no token:
        the password is the credential, and a token meant for another server never leaves.
        Wrong passwords count towards the server's lockout (RateLimited)."""
        token = Token.of(self._call("POST", "tokens/login/", anonymous=True, json={
            "username": username, "password": password, "client": client or client_name()}))
        self._use_token(token.token)
        return token

    def whoami(self) -> Me:
        """The user, role and token this client calls with."""
        return Me.of(self._call("GET", "me/"))

    def logout(self) -> None:
        """Revoke the token this client calls with; the client has none afterwards."""
        self._call("POST", "tokens/logout/")
        self._use_token(None)

    def list_tokens(self) -> list[Token]:
        """Your tokens (an admin: everyone's)."""
        return [Token.of(t) for t in self._pages("tokens/")]

    def create_token(self, name: str, *, expires_in_days: int | None = 90,
                     read_only: bool = False, user: str | None = None) -> Token:
        """A named token (the secret in `token`, shown once), for yourself or (admins) `user`;
        `read_only`: GET only; expires_in_days None: never expires."""
        body: dict[str, Any] = {"name": name, "expires_in_days": expires_in_days,
                                "read_only": read_only}
        if user is not None:
            body["user"] = user
        return Token.of(self._call("POST", "tokens/", json=body))

    def revoke_token(self, token_key: str) -> None:
        self._call("DELETE", f"tokens/{token_key}/")

    def list_users(self) -> list[User]:
        return [User.of(u) for u in self._pages("users/")]

    def create_user(self, username: str, role: str, *, email: str = "",
                    password: str = "") -> User:
        """An active user with a role (viewer, engineer, admin); without `password` one is
        generated and answered once in `.password`."""
        return User.of(self._call("POST", "users/", json={
            "username": username, "role": role, "email": email, "password": password}))

    def update_user(self, username: str, *, role: str | None = None,
                    is_active: bool | None = None) -> User:
        """Change the role, or deactivate (every token stops working at once) / reactivate."""
        body = {k: v for k, v in (("role", role), ("is_active", is_active)) if v is not None}
        return User.of(self._call("PATCH", f"users/{username}/", json=body))

    def audit(self, *, model: str | None = None, actor: str | None = None,
              action: str | None = None, since: str | None = None,
              until: str | None = None, limit: int | None = 500) -> list[AuditEvent]:
        """Audit events, newest first, at most `limit` (None: all); `action` matches a prefix
        ("version."), `since`/`until` are ISO 8601 times."""
        events = self._pages("audit/", {"model": model, "actor": actor, "action": action,
                                        "since": since, "until": until})
        return [AuditEvent.of(e) for e in islice(events, limit)]
