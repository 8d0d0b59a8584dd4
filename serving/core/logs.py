"""A process's logging: its line format (text, or JSON with MMC_LOG_FORMAT=json) and the Triton
logging extension's settings (`log_info`, `log_warning`, `log_error`, `log_verbose_level`,
`log_format`), applied to the process's loggers while it runs.

Both fronts change the settings through `LogControl.update`; the console's settings use the same
formatters, so a console line and a replica line look alike. A JSON line carries `request_id`
(REQUEST_ID, set per request by the front that took it) and `trace_id` / `span_id` when the
request is traced.

    {"time": "2025-01-01T10:00:00.123Z", "level": "ERROR", "logger": "serving.core.dataplane",
     "message": "model 'm' version '1' failed: ...", "request_id": "r-17",
     "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7"}
"""

from __future__ import annotations

import logging
import sys
import time
from contextvars import ContextVar
from dataclasses import asdict, dataclass, replace

from serving.core.errors import InvalidInput
from serving.core.extras import MissingExtra

#: The request a line is about: the caller's X-Request-Id, else the v2 request's `id`.
REQUEST_ID: ContextVar[str | None] = ContextVar("mmc_request_id", default=None)
#: (trace id, span id) of the traced request a line is about, as hex (serving.core.tracing).
TRACE_IDS: ContextVar[tuple[str, str] | None] = ContextVar("mmc_trace_ids", default=None)

LOG_FORMATS = ("default", "ISO8601")
#: MMC_LOG_FORMAT's values: a line of text, or one JSON object per line.
LINE_FORMATS = ("text", "json")
JSON_PACKAGE = "python-json-logger"
#: Where a verbose level lets DEBUG through: 1 our own modules, 2 and up every library's too.
OWN_LOGGERS = ("serving", "registry", "console", "uvicorn")
_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_SETTINGS = ("log_file", "log_info", "log_warning", "log_error", "log_verbose_level",
             "log_format")


@dataclass(frozen=True)
class LogSettings:
    """The logging extension's settings (Triton's names). `log_file` is always "" (stderr)."""

    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"

    @classmethod
    def from_level(cls, level: str) -> LogSettings:
        """The settings a `--log-level` name stands for (mmc-serve's default: warning)."""
        name = level.lower()
        verbose = name in ("debug", "trace", "notset")
        return cls(log_info=verbose or name == "info",
                   log_warning=name not in ("error", "critical"),
                   log_verbose_level=1 if verbose else 0)

    def to_json(self) -> dict:
        return {"log_file": "", **asdict(self)}

    def allows(self, levelno: int) -> bool:
        if levelno < logging.INFO:
            return self.log_verbose_level > 0
        if levelno < logging.WARNING:
            return self.log_info
        if levelno < logging.ERROR:
            return self.log_warning
        return self.log_error

    def root_level(self) -> int:
        """The root logger's level: the lowest level written, DEBUG only from verbose level 2
        (level 1 opens DEBUG on our own loggers alone), above CRITICAL when nothing is."""
        if self.log_verbose_level >= 2:
            return logging.DEBUG
        for level in (logging.INFO, logging.WARNING, logging.ERROR):
            if self.allows(level):
                return level
        return logging.CRITICAL + 1


def parse_log_settings(doc, current: LogSettings) -> LogSettings:
    """`current` changed by a request's settings (JSON types; gRPC's arrive converted). A
    setting that is null is left as it is, as Triton does. InvalidInput names the setting."""
    if type(doc) is not dict:
        raise InvalidInput("the log settings must be a JSON object of setting: value")
    changes: dict = {}
    for name, value in doc.items():
        if name not in _SETTINGS:
            raise InvalidInput(f"unknown log setting '{name}': the settings are "
                               f"{', '.join(_SETTINGS)}")
        if value is None:
            continue
        if name == "log_file":
            raise InvalidInput("log_file cannot be set: writing the log to a file is not "
                               "supported here, as it would let a caller write files on the "
                               "server (the log goes to stderr)")
        if name == "log_verbose_level":
            if type(value) is not int or not 0 <= value < 2**32:
                raise InvalidInput(f"log_verbose_level must be an unsigned integer, got "
                                   f"{value!r}")
        elif name == "log_format":
            if value not in LOG_FORMATS:
                raise InvalidInput(f"log_format must be one of {', '.join(LOG_FORMATS)}, got "
                                   f"{value!r}")
        elif type(value) is not bool:
            raise InvalidInput(f"{name} must be a boolean, got {value!r}")
        changes[name] = value
    return replace(current, **changes)


class _LevelFilter(logging.Filter):
    """Lets a line through when the settings' switch for its level is on."""

    def __init__(self, control: LogControl) -> None:
        super().__init__()
        self.control = control

    def filter(self, record: logging.LogRecord) -> bool:
        return self.control.settings.allows(record.levelno)


class RequestContext(logging.Filter):
    """Adds `request_id`, `trace_id` and `span_id` to a line when it has them (a handler's
    filter: the JSON formatter writes what a record carries)."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = REQUEST_ID.get()
        if request_id is not None and not hasattr(record, "request_id"):
            record.request_id = request_id
        ids = TRACE_IDS.get() or _otel_ids()
        if ids is not None and not hasattr(record, "trace_id"):
            record.trace_id, record.span_id = ids
        return True


def keep_trace_ids() -> None:
    """The current OpenTelemetry span's ids kept for the rest of the request's context: its
    lines written after that span ends (Django's "Not Found" and error lines) carry them too."""
    ids = _otel_ids()
    if ids is not None:
        TRACE_IDS.set(ids)


def _otel_ids() -> tuple[str, str] | None:
    """The current OpenTelemetry span's ids (the console's Django and Celery spans), when
    OpenTelemetry is loaded at all."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def iso8601(record: logging.LogRecord) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{stamp}.{int(record.msecs):03d}Z"


class TextFormatter(logging.Formatter):
    """`2025-01-01 10:00:00,123 WARNING serving.core.reconciler: ...`, its time as the
    process's log_format says: the local default, or ISO 8601 in UTC."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if CONTROL.settings.log_format == "ISO8601":
            return iso8601(record)
        return super().formatTime(record, datefmt)

    def __init__(self, fmt: str = _TEXT, *args, **kwargs) -> None:
        super().__init__(fmt, *args, **kwargs)


def json_formatter_class():
    """python-json-logger's formatter with our field names and log_format's timestamps
    (imported when asked for: the package is optional)."""
    try:
        from pythonjsonlogger.core import RESERVED_ATTRS
        from pythonjsonlogger.json import JsonFormatter
    except ImportError:
        raise MissingLogPackage() from None

    class Formatter(JsonFormatter):
        """Its `time` always ISO 8601 in UTC (a line read by machines)."""

        def __init__(self, *args, **kwargs) -> None:
            kwargs.setdefault("rename_fields", {"asctime": "time", "levelname": "level",
                                                "name": "logger"})
            # uvicorn's extra copy of its message with terminal colours
            kwargs.setdefault("reserved_attrs", [*RESERVED_ATTRS, "color_message"])
            super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s", *args, **kwargs)

        def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
            return iso8601(record)

    return Formatter


def JsonFormatter(*args, **kwargs) -> logging.Formatter:  # noqa: N802 - used as a class
    """One JSON object per line (the console's LOGGING names this as its formatter's `()`)."""
    return json_formatter_class()(*args, **kwargs)


class MissingLogPackage(MissingExtra):
    """MMC_LOG_FORMAT=json without its formatter's package."""

    def __init__(self) -> None:
        self.feature, self.extra = "MMC_LOG_FORMAT=json", "json-logs"
        RuntimeError.__init__(self, f"MMC_LOG_FORMAT=json but {JSON_PACKAGE} is not installed: "
                                    "pip install 'mmc[json-logs]'")


def line_format(env) -> str:
    """MMC_LOG_FORMAT, checked: "text" (default) or "json" (MissingLogPackage without its
    package, ValueError for another value)."""
    value = (env.get("MMC_LOG_FORMAT") or "text").strip().lower()
    if value not in LINE_FORMATS:
        raise ValueError(f"MMC_LOG_FORMAT={value!r}: one of {', '.join(LINE_FORMATS)}")
    if value == "json":
        json_formatter_class()
    return value


class LogControl:
    """The logging extension over this process's loggers: the settings it answers with, and
    their effect (the root logger's level, our loggers' DEBUG, each root handler's filter)."""

    def __init__(self, settings: LogSettings | None = None) -> None:
        self._settings = settings
        self._filter = _LevelFilter(self)

    @property
    def settings(self) -> LogSettings:
        """Until set, what the root logger's level stands for (the console's LOG_LEVEL, in a
        process whose logging Django configured)."""
        if self._settings is None:
            level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
            return LogSettings.from_level(level if isinstance(level, str) else "warning")
        return self._settings

    def to_json(self) -> dict:
        return self.settings.to_json()

    def update(self, doc) -> dict:
        """Validate every setting of `doc`, then apply them together; the new settings."""
        self.set(parse_log_settings(doc, self.settings))
        return self.to_json()

    def set(self, settings: LogSettings) -> None:
        self._settings = settings
        self.apply()

    def apply(self) -> None:
        settings = self.settings
        root = logging.getLogger()
        root.setLevel(settings.root_level())
        own = logging.DEBUG if settings.log_verbose_level >= 1 else logging.NOTSET
        for name in OWN_LOGGERS:
            logging.getLogger(name).setLevel(own)
        for handler in root.handlers:
            if self._filter not in handler.filters:
                handler.addFilter(self._filter)


#: This process's log settings (logging is the process's, whichever front changes it).
CONTROL = LogControl()


def configure(*, line: str = "text", level: str = "warning") -> LogControl:
    """A serving process's logging: one stderr handler on the root logger, in `line` format,
    with the settings `level` stands for; uvicorn's loggers write through it too (mmc-serve
    passes log_config=None)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if line == "json" else TextFormatter())
    handler.addFilter(RequestContext())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    CONTROL.set(LogSettings.from_level(level))
    return CONTROL
