"""Logging filters, importable while settings configure logging (before the apps are ready)."""

from __future__ import annotations

import logging

from django.db import InterfaceError, OperationalError


def database_unavailable(exc: BaseException | None) -> bool:
    """The database refused or lost the connection: a 503 to retry, not a bug (500)."""
    return isinstance(exc, OperationalError | InterfaceError)


class ExpectedErrorLogFilter(logging.Filter):
    """django.request: an answer that is expected traffic, not a bug, is one WARNING line with no
    traceback: a refused request (403, with its reason) and the database being down (503)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if database_unavailable(exc):
            self._one_line(record, f"database unavailable: {type(exc).__name__}")
        elif getattr(record, "status_code", None) == 403 and record.exc_info:
            self._one_line(record, str(exc) if exc is not None and str(exc)
                           else "permission denied")
        return True

    @staticmethod
    def _one_line(record: logging.LogRecord, note: str) -> None:
        record.msg, record.args = "%s (%s)", (record.getMessage(), note)
        record.exc_info, record.exc_text = None, None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
