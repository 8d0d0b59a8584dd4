"""Domain errors raised by services; the API maps each to a status code once, centrally."""

from __future__ import annotations

import os
import re

#: An absolute path in a message: a slash that starts a word, then path characters.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.~<>/-])/[^\s'\"()\[\]{},;:]+")


def without_paths(text: str, root: str | os.PathLike | None = None) -> str:
    """`text` as users may see it: `root` (ARTIFACT_ROOT) shown as <store>, any other absolute
    path as its last part, so a reason never tells a caller how this host is laid out."""
    if root:
        for form in {str(root), os.path.realpath(root)}:
            text = text.replace(form.rstrip("/"), "<store>")
    return _ABSOLUTE_PATH.sub(lambda m: os.path.basename(m.group().rstrip("/")) or "<path>", text)


class RegistryError(Exception):
    status = 400

    def __init__(self, message: str, *, field: str | None = None, details=None):
        super().__init__(message)
        self.message = message
        self.field = field
        self.details = details


class InvalidRequest(RegistryError):
    status = 400


class NotFound(RegistryError):
    status = 404


class LoginRefused(RegistryError):
    """The user name and password did not match an active user (401)."""

    status = 401


class CredentialsRequired(RegistryError):
    """The request needs a caller, and presented no valid token or session (401)."""

    status = 401


class TooManyAttempts(RegistryError):
    """Refused for now; `retry_after` seconds say when to try again (429)."""

    status = 429

    def __init__(self, message: str, *, retry_after: int | None = None, **kwargs):
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class Forbidden(RegistryError):
    """The caller may not do this, whatever the object's state (403)."""

    status = 403


class LifecycleError(RegistryError):
    """The object's current state forbids the transition (409)."""

    status = 409


class ConversionRefused(RegistryError):
    """The request was understood, but the model cannot be converted as asked (an operator with
    no adapter, outputs that differ beyond the tolerance) (422)."""

    status = 422


class Gone(RegistryError):
    """It existed, but its data was removed (expired) and cannot come back (410)."""

    status = 410


class PayloadTooLarge(RegistryError):
    status = 413


class RequestTimeout(RegistryError):
    """A request body stalled or arrived slower than the minimum rate; what came is dropped."""

    status = 408


class InsufficientStorage(RegistryError):
    """Storing this would leave the disk below the free space it keeps (507)."""

    status = 507


class StoreFull(InsufficientStorage):
    """The disk ran out of space (ENOSPC) while a file was being written; what was written of it
    is removed (507)."""


class StoreUnavailable(RegistryError):
    """The artifact store (an object store) did not answer; nothing was kept: try again."""

    status = 503
    retry_after = 5


class SignInRefused(RegistryError):
    """The identity was proven elsewhere (single sign-on), but this console does not let it in."""

    status = 403
