"""Traces of inferences (OpenTelemetry), and the Triton trace extension's settings that choose
which inferences are traced.

Off unless the process is given an exporter by the standard OpenTelemetry variables
(`exporter_from_env`): OTEL_TRACES_EXPORTER (otlp, console; none: off), or else an OTLP endpoint
(OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); OTEL_SDK_DISABLED=true turns it
off whatever else is set. The packages (opentelemetry-sdk and the OTLP exporter) are imported
only then.

While nothing can be traced, `Tracing.active` is False and that one attribute is all an inference
reads of this module. Otherwise each front asks `begin()` per inference: the settings (global,
and per model where a model sets its own; a model's setting cleared by null follows the global
one again) decide, one in `trace_rate` inferences at `trace_level` TIMESTAMPS, at most
`trace_count` of them (-1: no limit). A traced inference is one trace whose parent is the
caller's W3C `traceparent` (HTTP header, gRPC metadata): a server span with children `decode`
(receive and decode), `queue` (waiting for a batch), `compute` (the batch's run, attribute
`batch_size`) and `encode`. Spans are made after the fact from the perf counter times the
data plane takes anyway.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from time import perf_counter_ns, time_ns

from serving.core.errors import InvalidInput
from serving.core.extras import MissingExtra
from serving.core.logs import TRACE_IDS

TRACE_LEVELS = ("OFF", "TIMESTAMPS")
SETTINGS = ("trace_level", "trace_rate", "trace_count", "log_frequency")
TRACE_MODE = "opentelemetry"
#: The packages an exporter needs, by OTEL_TRACES_EXPORTER / OTLP protocol.
SDK = ("opentelemetry.sdk", "opentelemetry-sdk")
OTLP_HTTP = ("opentelemetry.exporter.otlp.proto.http", "opentelemetry-exporter-otlp-proto-http")
OTLP_GRPC = ("opentelemetry.exporter.otlp.proto.grpc", "opentelemetry-exporter-otlp-proto-grpc")
#: Triton's default sampling: one inference in 1000 (MMC_TRACE_RATE changes it at start).
DEFAULT_RATE = 1000
_TRUE = ("true", "1", "yes")


class MissingTracePackages(MissingExtra):
    """Tracing is switched on by the environment but its packages are not installed."""

    def __init__(self, feature: str, distributions: list[str]) -> None:
        self.feature, self.extra = feature, "tracing"
        # the `[tracing]` extra has the SDK, the OTLP/HTTP exporter and the console's
        # instrumentations; the OTLP/gRPC exporter is named on its own
        beyond = [d for d in distributions if d == OTLP_GRPC[1]]
        install = " ".join(["'mmc[tracing]'", *beyond])
        RuntimeError.__init__(self, f"{feature} but {distributions[0]} is not installed: pip "
                                    f"install {install}")


@dataclass(frozen=True)
class Exporter:
    """Where spans go, as the environment says: OTLP (`protocol` http/protobuf or grpc) or the
    console exporter (stdout), possibly both; `why` names the variable that turned it on."""

    kinds: tuple[str, ...]
    protocol: str
    why: str


def exporter_from_env(env=None) -> Exporter | None:
    """The exporter the OTEL_* variables ask for, or None (tracing off). ValueError for an
    exporter or protocol this server does not offer."""
    e = os.environ if env is None else env
    if (e.get("OTEL_SDK_DISABLED") or "").strip().lower() in _TRUE:
        return None
    names = [n.strip().lower() for n in (e.get("OTEL_TRACES_EXPORTER") or "").split(",")
             if n.strip()]
    if names:
        why = f"OTEL_TRACES_EXPORTER={e['OTEL_TRACES_EXPORTER']}"
        names = [n for n in names if n != "none"]
        if not names:
            return None
    else:
        endpoint = next((k for k in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                                     "OTEL_EXPORTER_OTLP_ENDPOINT") if e.get(k)), None)
        if endpoint is None:
            return None
        names, why = ["otlp"], f"{endpoint}={e[endpoint]}"
    unknown = [n for n in names if n not in ("otlp", "console")]
    if unknown:
        raise ValueError(f"OTEL_TRACES_EXPORTER: '{unknown[0]}' is not offered here (otlp, "
                         "console or none)")
    protocol = (e.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or e.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf").strip().lower()
    if "otlp" in names and protocol not in ("http/protobuf", "grpc"):
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol}: http/protobuf or grpc")
    return Exporter(tuple(names), protocol, why)


def require_packages(exporter: Exporter) -> None:
    """MissingTracePackages unless the exporter's packages are installed (looked up, not
    imported: a supervisor of several workers checks too)."""
    import importlib.util

    wanted = [SDK]
    if "otlp" in exporter.kinds:
        wanted.append(OTLP_GRPC if exporter.protocol == "grpc" else OTLP_HTTP)
    missing = []
    for module, distribution in wanted:
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:
            found = False
        if not found:
            missing.append(distribution)
    if missing:
        raise MissingTracePackages(f"tracing is on ({exporter.why})", missing)


_PROVIDER_LOCK = threading.Lock()
_PROVIDER = None


def install_provider(exporter: Exporter, *, service: str, instance: str = ""):
    """This process's TracerProvider (made once, set as OpenTelemetry's global one so the
    console's instrumentations share it): a batch span processor per exporter, the resource
    from OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES with `service` as the default name."""
    global _PROVIDER
    require_packages(exporter)
    with _PROVIDER_LOCK:
        if _PROVIDER is not None:
            return _PROVIDER
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        attributes = {"service.name": os.environ.get("OTEL_SERVICE_NAME") or service}
        if instance:
            attributes["service.instance.id"] = instance
        provider = TracerProvider(resource=Resource.create(attributes))
        for kind in exporter.kinds:
            provider.add_span_processor(BatchSpanProcessor(_span_exporter(kind, exporter)))
        trace.set_tracer_provider(provider)
        _PROVIDER = provider
        return provider


def _span_exporter(kind: str, exporter: Exporter):
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if exporter.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter()  # endpoint, headers, timeout: the OTEL_EXPORTER_OTLP_* variables


# -- the trace extension's settings -----------------------------------------------------------


def _count(name: str, value, low: int, high: int = 2**32 - 1) -> int:
    """A number setting: Triton's string ("1000"), or a JSON integer."""
    if type(value) is str and value.strip().lstrip("-").isdigit():
        number = int(value)
    elif type(value) is int:
        number = value
    else:
        raise InvalidInput(f"{name} must be an integer (as a string, e.g. \"1000\"), got "
                           f"{value!r}")
    if not low <= number <= high:
        raise InvalidInput(f"{name} must be between {low} and {high}, got {number}")
    return number


def parse_trace_settings(doc) -> dict:
    """A request's settings, checked: name -> value, or None to clear (a model's setting then
    follows the global one). InvalidInput names the setting."""
    if type(doc) is not dict:
        raise InvalidInput("the trace settings must be a JSON object of setting: value")
    out: dict = {}
    for name, value in doc.items():
        if name == "trace_file":
            raise InvalidInput("trace_file cannot be set: traces go to the OpenTelemetry "
                               "exporter (OTEL_EXPORTER_OTLP_ENDPOINT), never to a file a "
                               "caller names")
        if name == "trace_mode":
            if value not in (None, TRACE_MODE, [TRACE_MODE]):
                raise InvalidInput(f"trace_mode is fixed: {TRACE_MODE}")
            continue
        if name not in SETTINGS:
            raise InvalidInput(f"unknown trace setting '{name}': the settings are "
                               f"{', '.join(SETTINGS)}")
        if value is None:
            out[name] = None
        elif name == "trace_level":
            levels = [value] if type(value) is str else value
            if type(levels) is not list or not levels or \
                    any(type(v) is not str for v in levels):
                raise InvalidInput(f"trace_level must be a list of levels (OFF or TIMESTAMPS), "
                                   f"got {value!r}")
            for level in levels:
                if level not in TRACE_LEVELS:
                    raise InvalidInput(f"trace_level '{level}' is not offered: OFF or TIMESTAMPS"
                                       + (" (tensors are not traced)" if level == "TENSORS"
                                          else ""))
            if "OFF" in levels and len(levels) > 1:
                raise InvalidInput("trace_level: OFF stands alone")
            out[name] = "OFF" if levels == ["OFF"] else "TIMESTAMPS"
        elif name == "trace_rate":
            out[name] = _count(name, value, 1)
        elif name == "trace_count":
            out[name] = _count(name, value, -1, 2**31 - 1)
        else:
            out[name] = _count(name, value, 0)
    return out


class Tracing:
    """Which inferences are traced, and their spans. `active` (a plain attribute, read once per
    inference) is True while some setting may trace and an exporter is there."""

    def __init__(self, provider=None, *, level: str = "TIMESTAMPS",
                 rate: int = DEFAULT_RATE) -> None:
        self._tracer = provider.get_tracer("mmc.serving") if provider is not None else None
        self._provider = provider
        initial = level if provider is not None else "OFF"
        self.global_: dict = {"trace_level": initial, "trace_rate": rate, "trace_count": -1,
                              "log_frequency": 0}
        self._initial = dict(self.global_)  # what a global setting cleared by null goes back to
        self.models: dict[str, dict] = {}  # the settings each model sets itself
        self._seen: dict[str, int] = {}  # inferences counted for sampling, per setting owner
        self.active = False
        self._refresh()

    @classmethod
    def from_env(cls, env=None, *, service: str = "mmc-serve", instance: str = "") -> Tracing:
        """Off, or the exporter OTEL_* asks for (MissingTracePackages without its packages)."""
        e = os.environ if env is None else env
        exporter = exporter_from_env(e)
        if exporter is None:
            return cls()
        rate = _count("MMC_TRACE_RATE", e.get("MMC_TRACE_RATE") or str(DEFAULT_RATE), 1)
        return cls(install_provider(exporter, service=service, instance=instance), rate=rate)

    @property
    def exporting(self) -> bool:
        return self._tracer is not None

    # -- settings ----------------------------------------------------------------------------

    def _effective(self, model: str | None) -> dict:
        own = self.models.get(model) if model is not None else None
        return {**self.global_, **own} if own else self.global_

    def to_json(self, model: str | None = None) -> dict:
        """The settings as Triton answers them (numbers as strings); a model's with the global
        ones where it sets none."""
        s = self._effective(model)
        return {"trace_level": [s["trace_level"]], "trace_rate": str(s["trace_rate"]),
                "trace_count": str(s["trace_count"]), "log_frequency": str(s["log_frequency"]),
                "trace_mode": TRACE_MODE}

    def update(self, doc, model: str | None = None) -> dict:
        """Change the global settings, or `model`'s (null clears a model's own setting; for the
        global ones null puts back the default). The settings after."""
        changes = parse_trace_settings(doc)
        if changes.get("trace_level") == "TIMESTAMPS" and not self.exporting:
            raise InvalidInput(
                "trace_level TIMESTAMPS: no trace exporter is configured on this replica; start "
                "it with OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_TRACES_EXPORTER) set")
        if model is None:
            for name, value in changes.items():
                self.global_[name] = self._initial[name] if value is None else value
        else:
            own = dict(self.models.get(model, {}))
            for name, value in changes.items():
                if value is None:
                    own.pop(name, None)
                else:
                    own[name] = value
            if own:
                self.models[model] = own
            else:
                self.models.pop(model, None)
                self._seen.pop(model, None)
        if "trace_rate" in changes:
            self._seen.pop(model or "", None)
        self._refresh()
        return self.to_json(model)

    def clear(self, model: str) -> dict:
        """A model's own settings removed: it follows the global ones."""
        self.models.pop(model, None)
        self._seen.pop(model, None)
        self._refresh()
        return self.to_json(model)

    def state(self) -> dict:
        """The settings, to share with the other workers (serving.process.shared_settings)."""
        return {"global": dict(self.global_), "models": {m: dict(s) for m, s in
                                                        self.models.items()}}

    def adopt(self, state: dict) -> None:
        """Another worker's settings (as `state` wrote them): taken whole."""
        self.global_ = dict(state["global"])
        self.models = {m: dict(s) for m, s in state["models"].items()}
        self._seen.clear()
        self._refresh()

    def _refresh(self) -> None:
        def may(s: dict) -> bool:
            return s["trace_level"] != "OFF" and s["trace_count"] != 0

        self.active = self.exporting and (
            may(self.global_) or any(may(self._effective(m)) for m in self.models))

    # -- per inference -----------------------------------------------------------------------

    def picks(self, model: str) -> bool:
        """Whether the settings trace this inference of `model` (counted: one in trace_rate,
        trace_count of them). Cheap: nothing is built for the inferences it does not pick."""
        own = self.models.get(model)
        s = {**self.global_, **own} if own else self.global_
        if s["trace_level"] == "OFF" or s["trace_count"] == 0:
            return False
        key = model if own and "trace_rate" in own else ""
        seen = self._seen.get(key, 0)
        self._seen[key] = seen + 1
        if seen % s["trace_rate"]:
            return False
        if s["trace_count"] > 0:  # counted down where it is set: the model's own, or global
            holder = own if own and "trace_count" in own else self.global_
            holder["trace_count"] -= 1
            if holder["trace_count"] == 0:
                self._refresh()
        return True

    def start(self, carrier, *, name: str, start_ns: int, attributes: dict) -> RequestTrace:
        """The trace of an inference `picks` chose. `carrier`: the caller's headers or metadata
        (name -> value) holding its traceparent; `start_ns`: a perf_counter_ns() reading taken
        when the inference began."""
        return RequestTrace(self._tracer, carrier, name=name, start_ns=start_ns,
                            attributes=attributes)

    def begin(self, model: str, carrier, *, name: str, start_ns: int,
              attributes: dict) -> RequestTrace | None:
        """`start` when `picks(model)`, else None."""
        if not self.picks(model):
            return None
        return self.start(carrier, name=name, start_ns=start_ns, attributes=attributes)

    def flush(self, timeout_ms: int = 5000) -> None:
        """Export what is buffered (at shutdown)."""
        if self._provider is not None:
            self._provider.force_flush(timeout_ms)


class RequestTrace:
    """One traced inference: its server span and the child spans, timed by perf counter."""

    __slots__ = ("tracer", "root", "context", "offset")

    def __init__(self, tracer, carrier, *, name: str, start_ns: int, attributes: dict) -> None:
        from opentelemetry import propagate, trace

        self.tracer = tracer
        self.offset = time_ns() - perf_counter_ns()  # perf counter -> epoch ns
        parent = propagate.extract(carrier) if carrier else None
        self.root = tracer.start_span(name, context=parent, kind=trace.SpanKind.SERVER,
                                      start_time=start_ns + self.offset, attributes=attributes)
        self.context = trace.set_span_in_context(self.root)
        ids = self.root.get_span_context()
        # The request's log lines carry its ids (serving.core.logs.RequestContext), to the end
        # of the task the front runs it in (one per request or call), its error line included.
        TRACE_IDS.set((format(ids.trace_id, "032x"), format(ids.span_id, "016x")))

    @property
    def trace_id(self) -> int:
        return self.root.get_span_context().trace_id

    def span(self, name: str, start_ns: int, end_ns: int, attributes: dict | None = None,
             error: BaseException | None = None) -> None:
        """A finished child span from two perf_counter_ns() readings."""
        span = self.tracer.start_span(name, context=self.context, start_time=start_ns +
                                      self.offset, attributes=attributes)
        if error is not None:
            _failed(span, error)
        span.end(end_time=end_ns + self.offset)

    def batch(self, enqueued_ns: int, started_ns: int, times: tuple[int, int, int],
              batch_size: int, rows: int, error: BaseException | None) -> None:
        """The batcher's part: waiting in its queue, then the batch's run (merge, run, split)."""
        self.span("queue", enqueued_ns, started_ns)
        merge, run, split = times
        self.span("compute", started_ns, started_ns + merge + run + split,
                  {"batch_size": batch_size, "batch_rows": rows, "merge_ns": merge,
                   "run_ns": run, "split_ns": split}, error)

    def end(self, error: BaseException | None = None, attributes: dict | None = None) -> None:
        root = self.root
        if attributes:
            root.set_attributes(attributes)
        if error is not None:
            _failed(root, error)
        root.end()


def _failed(span, error: BaseException) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:300]))
    span.set_attribute("error.type", type(error).__name__)


@contextmanager
def client_span(name: str, headers: dict, attributes: dict | None = None) -> Iterator[None]:
    """A CLIENT span around an outbound call (a webhook, a job's callback) whose W3C context
    goes into `headers`, while this process traces; nothing otherwise."""
    provider = _PROVIDER
    if provider is None:
        yield
        return
    from opentelemetry import propagate, trace

    tracer = provider.get_tracer("mmc")
    with tracer.start_as_current_span(name, kind=trace.SpanKind.CLIENT, attributes=attributes):
        propagate.inject(headers)
        yield
