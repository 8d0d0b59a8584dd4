"""Logging filters, importable while settings configure logging (before the apps are ready)."""

from __future__ import annotations

import logging

from django.db import InterfaceError, OperationalError


def database_unavailable(exc: BaseException | None) -> bool:
    """The database refused or lost the connection: a 503 to retry, not a bug (500)."""
    return isinstance(exc, OperationalError | InterfaceError)


class ForbiddenLogFilter(logging.Filter):
    """A refused request (403) is expected traffic, not a bug: one WARNING line, no traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "status_code", None) == 403 and record.exc_info:
            exc = record.exc_info[1]
            reason = str(exc) if exc is not None and str(exc) else "permission denied"
            message = record.getMessage()
            record.msg, record.args = "%s (%s)", (message, reason)
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


class DatabaseDownLogFilter(logging.Filter):
    """One line, not a traceback per request, while the database is down (django.request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if database_unavailable(exc):
            record.msg = "%s (database unavailable: %s)"
            record.args = (record.getMessage(), type(exc).__name__)
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True
