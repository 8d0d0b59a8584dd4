"""The Triton trace and logging extensions, and OpenTelemetry traces, as clients see them: a real
`mmc-serve` (two workers, gRPC on) exporting to an OTLP/HTTP receiver in this process, driven by
tritonclient's HTTP and gRPC clients unchanged (`get/update_log_settings`,
`get/update_trace_settings`), by raw gRPC stubs and httpx for the bad calls those clients cannot
make; the sampling rules on the data plane's Tracing with the SDK's in-memory exporter; who may
change the settings on a replica that follows the registry."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from registry import samples
from serving.core import logs, tracing
from serving.core.dataplane import DataPlane
from serving.core.errors import Forbidden, InvalidInput
from serving.core.logs import LogControl, LogSettings
from serving.core.tracing import MissingTracePackages, Tracing
from serving.process.shared_settings import FOLLOW_SECONDS
from tests.serving.test_app import Server, write_model
from tests.serving.test_model_failures import divider

#: mmc-serve's defaults (--log-level warning) and the trace settings the server starts with
LOG_DEFAULTS = {"log_file": "", "log_info": False, "log_warning": True, "log_error": True,
                "log_verbose_level": 0, "log_format": "default"}
TRACE_DEFAULTS = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1",
                  "log_frequency": "0", "trace_mode": "opentelemetry"}


# -- an OTLP/HTTP receiver in this process -----------------------------------------------------


class OtlpReceiver:
    """Takes OTLP/HTTP protobuf exports on /v1/traces and keeps their spans as dicts."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        spans, lock = [], threading.Lock()
        self.spans, self.lock = spans, lock

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                with lock:
                    for resource in request.resource_spans:
                        for scope in resource.scope_spans:
                            spans.extend(_span(s) for s in scope.spans)
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def trace(self, trace_id: str, count: int, timeout: float = 15.0) -> list[dict]:
        """The spans of one trace, once `count` of them arrived (fewer after the timeout)."""
        deadline = time.time() + timeout
        while True:
            with self.lock:
                found = [s for s in self.spans if s["trace_id"] == trace_id]
            if len(found) >= count or time.time() > deadline:
                return found
            time.sleep(0.05)

    def close(self) -> None:
        self.httpd.shutdown()


def _span(span) -> dict:
    attributes = {}
    for kv in span.attributes:
        which = kv.value.WhichOneof("value")
        attributes[kv.key] = getattr(kv.value, which) if which else None
    return {"trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
            "parent": span.parent_span_id.hex(), "name": span.name, "kind": span.kind,
            "attributes": attributes, "start": span.start_time_unix_nano,
            "end": span.end_time_unix_nano, "error": span.status.code == 2}


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


# -- the replica ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def receiver():
    r = OtlpReceiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory, receiver):
    root = tmp_path_factory.mktemp("traced") / "models"
    write_model(root, "mlp", "1", samples.mlp(seed=0), {"max_batch_size": 32})
    write_model(root, "divider", "1", divider(), {"max_batch_size": 0})
    srv = Server(root, grpc=True, MMC_SERVE_WORKERS="2", MMC_LOG_FORMAT="json",
                 OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, OTEL_BSP_SCHEDULE_DELAY="50",
                 MMC_TRACE_RATE="1", OTEL_SERVICE_NAME="replica-under-test")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def http(server):
    c = thttp.InferenceServerClient(server.url.removeprefix("http://"))
    yield c
    c.close()


@pytest.fixture(scope="module")
def grpc_client(server):
    c = tgrpc.InferenceServerClient(server.grpc_address)
    yield c
    c.close()


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.grpc_address) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture
def settings_restored(server):
    """Whatever a spec changes, the next one starts from the server's defaults."""
    yield
    httpx.post(f"{server.url}/v2/logging", json={k: v for k, v in LOG_DEFAULTS.items()
                                                if k != "log_file"})
    httpx.post(f"{server.url}/v2/trace/setting",
               json={k: v for k, v in TRACE_DEFAULTS.items() if k != "trace_mode"})
    httpx.post(f"{server.url}/v2/models/mlp/trace/setting")  # no body: mlp's own settings go
    time.sleep(FOLLOW_SECONDS + 0.3)  # and every worker has taken them for its inferences


def _every_worker(server, path: str, n: int = 8) -> list[dict]:
    """`path` read n times over new connections (the kernel spreads them over the workers)."""
    return [httpx.get(f"{server.url}{path}", headers={"Connection": "close"}).json()
            for _ in range(n)]


def _http_refusal(call, *args, **kwargs) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call(*args, **kwargs)
    return info.value


def _mlp_input(module) -> object:
    x = module.InferInput("x", [1, 64], "FP32")
    x.set_data_from_numpy(np.full((1, 64), 0.25, np.float32))
    return x


# -- the logging extension ------------------------------------------------------------------------


def test_the_server_lists_the_trace_and_logging_extensions(http, grpc_client):
    assert {"trace", "logging"} <= set(http.get_server_metadata()["extensions"])
    assert {"trace", "logging"} <= set(grpc_client.get_server_metadata(as_json=True)["extensions"])


def test_tritonclient_http_reads_and_changes_the_log_settings_of_every_worker(
        server, http, settings_restored):
    assert http.get_log_settings() == LOG_DEFAULTS
    changed = http.update_log_settings({"log_info": True, "log_verbose_level": 2,
                                        "log_format": "ISO8601"})
    assert changed == {**LOG_DEFAULTS, "log_info": True, "log_verbose_level": 2,
                       "log_format": "ISO8601"}
    assert all(doc == changed for doc in _every_worker(server, "/v2/logging"))
    # null leaves a setting as it is (Triton's reading of it)
    assert http.update_log_settings({"log_info": None, "log_file": None}) == changed


def test_tritonclient_grpc_reads_and_changes_the_log_settings(server, grpc_client,
                                                             settings_restored):
    def plain(answer: dict) -> dict:
        return {k: next(iter(v.values())) for k, v in answer["settings"].items()}

    assert plain(grpc_client.get_log_settings(as_json=True)) == LOG_DEFAULTS
    changed = grpc_client.update_log_settings({"log_warning": False, "log_verbose_level": 1},
                                              as_json=True)
    assert plain(changed) == {**LOG_DEFAULTS, "log_warning": False, "log_verbose_level": 1}
    assert all(doc["log_warning"] is False for doc in _every_worker(server, "/v2/logging"))


@pytest.mark.parametrize(("settings", "named"), [
    ({"log_info": "yes"}, "log_info must be a boolean"),
    ({"log_error": 1}, "log_error must be a boolean"),
    ({"log_verbose_level": -1}, "log_verbose_level must be an unsigned integer"),
    ({"log_verbose_level": True}, "log_verbose_level must be an unsigned integer"),
    ({"log_verbose_level": "1"}, "log_verbose_level must be an unsigned integer"),
    ({"log_format": "xml"}, "log_format must be one of default, ISO8601"),
    ({"log_file": "/tmp/mmc-written.log"}, "log_file cannot be set"),
    ({"log_level": 1}, "unknown log setting 'log_level'"),
    ({"log_info": True, "log_format": "xml"}, "log_format"),  # nothing applied when one is bad
])
def test_a_bad_log_setting_is_a_400_naming_it_over_http(http, server, settings, named):
    error = _http_refusal(http.update_log_settings, settings)
    assert error.status() == "400" and named in error.message()
    assert http.get_log_settings() == LOG_DEFAULTS


def test_a_log_settings_body_that_is_not_an_object_is_a_400(server):
    for body in (b"[1, 2]", b"{not json", b'"log_info"'):
        r = httpx.post(f"{server.url}/v2/logging", content=body)
        assert r.status_code == 400 and "error" in r.json()
    r = httpx.delete(f"{server.url}/v2/logging")
    assert r.status_code == 405 and r.headers["allow"] == "GET, POST"


@pytest.mark.parametrize(("settings", "named"), [
    ({"log_file": "/tmp/mmc-written.log"}, "log_file cannot be set"),
    ({"log_format": "xml"}, "log_format must be one of"),
    ({"log_level": True}, "unknown log setting 'log_level'"),
])
def test_a_bad_log_setting_is_invalid_argument_over_grpc(grpc_client, settings, named):
    error = _http_refusal(grpc_client.update_log_settings, settings)
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and named in error.message()


def test_a_log_setting_of_the_wrong_type_is_invalid_argument_over_grpc(stub):
    """What tritonclient cannot send (it picks the type by name): a raw LogSettingsRequest."""
    for name, value in (("log_info", {"string_param": "yes"}),
                        ("log_verbose_level", {"bool_param": True}),
                        ("log_format", {"uint32_param": 1})):
        request = pb.LogSettingsRequest(settings={name: pb.LogSettingsRequest.SettingValue(
            **value)})
        with pytest.raises(grpc.RpcError) as info:
            stub.LogSettings(request)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert name in info.value.details()


# -- the trace extension --------------------------------------------------------------------------


def test_tritonclient_http_reads_and_changes_trace_settings_globally_and_per_model(
        server, http, settings_restored):
    assert http.get_trace_settings() == TRACE_DEFAULTS
    assert http.get_trace_settings("mlp") == TRACE_DEFAULTS  # no settings of its own yet
    mlp = http.update_trace_settings("mlp", {"trace_rate": "10", "trace_level": ["OFF"]})
    assert mlp == {**TRACE_DEFAULTS, "trace_rate": "10", "trace_level": ["OFF"]}
    assert http.get_trace_settings() == TRACE_DEFAULTS
    # what mlp does not set follows the global settings, changed afterwards too
    assert http.update_trace_settings(settings={"trace_count": "50", "log_frequency": "100"}) \
        == {**TRACE_DEFAULTS, "trace_count": "50", "log_frequency": "100"}
    assert http.get_trace_settings("mlp") == {**mlp, "trace_count": "50", "log_frequency": "100"}
    # a model's setting cleared by null falls back to the global one
    assert http.update_trace_settings("mlp", {"trace_rate": None})["trace_rate"] == "1"
    assert all(doc["trace_level"] == ["OFF"]
               for doc in _every_worker(server, "/v2/models/mlp/trace/setting"))
    # a request of no settings removes a model's own settings (Triton's HTTP protocol)
    assert httpx.post(f"{server.url}/v2/models/mlp/trace/setting").json()["trace_level"] == \
        ["TIMESTAMPS"]
    http.update_trace_settings("mlp", {"trace_rate": "7"})
    assert http.update_trace_settings("mlp", {})["trace_rate"] == "1"
    # integers are taken as well as Triton's strings
    assert http.update_trace_settings(settings={"trace_rate": 3})["trace_rate"] == "3"


def test_tritonclient_grpc_reads_and_changes_trace_settings_globally_and_per_model(
        grpc_client, http, settings_restored):
    def plain(answer: dict) -> dict:
        return {k: v.get("value", []) for k, v in answer["settings"].items()}

    expected = {k: v if isinstance(v, list) else [v] for k, v in TRACE_DEFAULTS.items()}
    assert plain(grpc_client.get_trace_settings(as_json=True)) == expected
    changed = grpc_client.update_trace_settings("mlp", {"trace_rate": "5",
                                                        "trace_level": ["OFF"]}, as_json=True)
    assert plain(changed) == {**expected, "trace_rate": ["5"], "trace_level": ["OFF"]}
    assert plain(grpc_client.get_trace_settings("mlp", as_json=True))["trace_rate"] == ["5"]
    assert http.get_trace_settings("mlp")["trace_rate"] == "5"  # one setting, both fronts
    cleared = grpc_client.update_trace_settings("mlp", {"trace_rate": None}, as_json=True)
    assert plain(cleared)["trace_rate"] == ["1"] and plain(cleared)["trace_level"] == ["OFF"]


@pytest.mark.parametrize(("settings", "named"), [
    ({"trace_rate": "often"}, "trace_rate must be an integer"),
    ({"trace_rate": "0"}, "trace_rate must be between 1"),
    ({"trace_rate": True}, "trace_rate must be an integer"),
    ({"trace_rate": ["1"]}, "trace_rate must be an integer"),
    ({"trace_count": "-2"}, "trace_count must be between -1"),
    ({"log_frequency": "-1"}, "log_frequency must be between 0"),
    ({"trace_level": ["TENSORS"]}, "trace_level 'TENSORS' is not offered"),
    ({"trace_level": ["LOUD"]}, "trace_level 'LOUD' is not offered"),
    ({"trace_level": ["OFF", "TIMESTAMPS"]}, "OFF stands alone"),
    ({"trace_level": 1}, "trace_level must be a list"),
    ({"trace_file": "/tmp/mmc-trace.json"}, "trace_file cannot be set"),
    ({"trace_mode": "triton"}, "trace_mode is fixed"),
    ({"trace_sampler": "1"}, "unknown trace setting 'trace_sampler'"),
])
def test_a_bad_trace_setting_is_a_400_naming_it_over_http(http, settings, named):
    for model in (None, "mlp"):
        error = _http_refusal(http.update_trace_settings, model, settings)
        assert error.status() == "400" and named in error.message()
    assert http.get_trace_settings() == TRACE_DEFAULTS


def test_trace_settings_of_an_unknown_model_are_a_404(server, http, grpc_client):
    error = _http_refusal(http.get_trace_settings, "ghost")
    assert error.status() == "404" and "ghost" in error.message()
    error = _http_refusal(http.update_trace_settings, "ghost", {"trace_rate": "2"})
    assert error.status() == "404"
    error = _http_refusal(grpc_client.update_trace_settings, "ghost", {"trace_rate": "2"})
    assert error.status() == "StatusCode.NOT_FOUND" and "ghost" in error.message()


@pytest.mark.parametrize(("settings", "named"), [
    ({"trace_rate": "often"}, "trace_rate must be an integer"),
    ({"trace_rate": ["1", "2"]}, "trace_rate takes one value"),
    ({"trace_level": ["TENSORS"]}, "trace_level 'TENSORS' is not offered"),
    ({"trace_file": "/tmp/mmc-trace.json"}, "trace_file cannot be set"),
    ({"trace_sampler": "1"}, "unknown trace setting 'trace_sampler'"),
])
def test_a_bad_trace_setting_is_invalid_argument_over_grpc(grpc_client, settings, named):
    error = _http_refusal(grpc_client.update_trace_settings, "mlp", settings)
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and named in error.message()


# -- traces ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("front", ["http", "grpc"])
def test_an_inference_is_one_trace_under_the_callers_traceparent(
        front, http, grpc_client, receiver):
    traceparent, trace_id, caller_span = _traceparent()
    if front == "http":
        http.infer("mlp", [_mlp_input(thttp)],
                   headers={"traceparent": traceparent, "X-Request-Id": "spec-1"})
        root_name = "POST /v2/models/{model}/infer"
    else:
        grpc_client.infer("mlp", [_mlp_input(tgrpc)],
                          headers={"traceparent": traceparent, "x-request-id": "spec-1"})
        root_name = "inference.GRPCInferenceService/ModelInfer"
    spans = {s["name"]: s for s in receiver.trace(trace_id, 5)}
    assert set(spans) == {root_name, "decode", "queue", "compute", "encode"}
    root = spans[root_name]
    assert root["parent"] == caller_span and root["kind"] == 2  # SERVER, the caller's child
    assert root["attributes"]["mmc.model"] == "mlp"
    assert root["attributes"]["mmc.version"] == "1"
    assert root["attributes"]["mmc.request_id"] == "spec-1"
    for name in ("decode", "queue", "compute", "encode"):
        span = spans[name]
        assert span["parent"] == root["span_id"]
        assert root["start"] <= span["start"] <= span["end"] <= root["end"]
    assert spans["decode"]["end"] <= spans["queue"]["start"]
    assert spans["queue"]["end"] == spans["compute"]["start"]
    assert spans["compute"]["end"] <= spans["encode"]["start"]
    assert spans["compute"]["attributes"]["batch_size"] >= 1


def test_a_failed_inference_is_a_trace_marked_as_an_error(server, receiver):
    traceparent, trace_id, _ = _traceparent()
    r = httpx.post(f"{server.url}/v2/models/divider/infer", headers={"traceparent": traceparent},
                   json={"inputs": [{"name": "x", "shape": [1, 2], "datatype": "INT32",
                                     "data": [1, 1]}]})
    assert r.status_code == 500
    spans = {s["name"]: s for s in receiver.trace(trace_id, 4)}
    assert spans["compute"]["error"] and spans["POST /v2/models/{model}/infer"]["error"]
    assert spans["POST /v2/models/{model}/infer"]["attributes"]["http.response.status_code"] \
        == 500


def test_tracing_switched_off_at_run_time_traces_nothing_until_it_is_on_again(
        server, http, receiver, settings_restored):
    http.update_trace_settings(settings={"trace_level": ["OFF"]})
    time.sleep(FOLLOW_SECONDS + 0.5)  # every worker has taken it
    traceparent, trace_id, _ = _traceparent()
    http.infer("mlp", [_mlp_input(thttp)], headers={"traceparent": traceparent})
    assert receiver.trace(trace_id, 1, timeout=1.0) == []
    http.update_trace_settings("mlp", {"trace_level": ["TIMESTAMPS"]})  # on for mlp alone
    time.sleep(FOLLOW_SECONDS + 0.5)
    traceparent, trace_id, _ = _traceparent()
    http.infer("mlp", [_mlp_input(thttp)], headers={"traceparent": traceparent})
    assert len(receiver.trace(trace_id, 5)) == 5


def test_json_log_lines_carry_the_request_id_and_the_trace_id(server, receiver):
    traceparent, trace_id, _ = _traceparent()
    r = httpx.post(f"{server.url}/v2/models/divider/infer",
                   headers={"traceparent": traceparent, "X-Request-Id": "json-line-1"},
                   json={"inputs": [{"name": "x", "shape": [1, 2], "datatype": "INT32",
                                     "data": [1, 1]}]})
    assert r.status_code == 500
    deadline = time.time() + 10
    while time.time() < deadline:
        lines = [json.loads(line) for line in server.log.read_text().splitlines()
                 if line.startswith("{")]
        failed = [line for line in lines if line.get("request_id") == "json-line-1"]
        if failed:
            break
        time.sleep(0.1)
    assert failed, server.log.read_text()[-2000:]
    line = failed[0]
    assert line["level"] == "ERROR" and line["logger"] == "serving.core.dataplane"
    assert "Integer division by zero" in line["message"]
    assert line["trace_id"] == trace_id and len(line["span_id"]) == 16
    assert line["time"].endswith("Z")
    for text in server.log.read_text().splitlines():  # every line the process logged is JSON
        if text.strip() and not text.startswith("[W:onnxruntime"):
            assert isinstance(json.loads(text), dict), text


# -- the sampling rules, on the data plane's Tracing ----------------------------------------------


@pytest.fixture
def spans():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _picked(t: Tracing, model: str, n: int) -> list[bool]:
    picked = []
    for _ in range(n):
        trace = t.begin(model, {}, name="infer", start_ns=time.perf_counter_ns(), attributes={})
        picked.append(trace is not None)
        if trace is not None:
            trace.end()
    return picked


def test_one_inference_in_trace_rate_is_traced_the_first_included(spans):
    provider, exporter = spans
    t = Tracing(provider, rate=3)
    assert t.active
    assert _picked(t, "m", 7) == [True, False, False, True, False, False, True]
    assert len(exporter.get_finished_spans()) == 3


def test_trace_count_counts_down_and_then_nothing_is_traced(spans):
    t = Tracing(spans[0], rate=1)
    assert t.update({"trace_count": "2"})["trace_count"] == "2"
    assert _picked(t, "m", 4) == [True, True, False, False]
    assert t.to_json()["trace_count"] == "0" and not t.active  # nothing left to trace


def test_a_model_traced_while_the_global_level_is_off_keeps_tracing_active(spans):
    t = Tracing(spans[0], rate=1)
    t.update({"trace_level": ["OFF"]})
    assert not t.active
    t.update({"trace_level": ["TIMESTAMPS"], "trace_rate": "2"}, "m")
    assert t.active
    assert _picked(t, "m", 4) == [True, False, True, False]
    assert _picked(t, "other", 2) == [False, False]
    t.update({"trace_level": None}, "m")  # falls back to the global OFF
    assert not t.active


def test_without_an_exporter_nothing_is_traced_and_timestamps_are_refused():
    t = Tracing()
    assert not t.active and t.to_json()["trace_level"] == ["OFF"]
    with pytest.raises(InvalidInput, match="OTEL_EXPORTER_OTLP_ENDPOINT"):
        t.update({"trace_level": ["TIMESTAMPS"]})
    assert t.update({"trace_rate": "5"})["trace_rate"] == "5"  # other settings are kept


@pytest.mark.parametrize(("env", "kinds"), [
    ({}, None),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ("otlp",)),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, ("otlp",)),
    ({"OTEL_TRACES_EXPORTER": "console"}, ("console",)),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, None),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, None),
])
def test_tracing_is_on_when_the_otel_variables_name_an_exporter(env, kinds):
    exporter = tracing.exporter_from_env(env)
    assert (exporter.kinds if exporter else None) == kinds


def test_tracing_turned_on_without_its_packages_says_what_to_install(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    exporter = tracing.exporter_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    with pytest.raises(MissingTracePackages) as info:
        tracing.require_packages(exporter)
    assert str(info.value) == (
        "tracing is on (OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4318) but opentelemetry-sdk is "
        "not installed: pip install 'mmc[tracing]'")
    grpc = tracing.exporter_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317",
                                      "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    with pytest.raises(MissingTracePackages, match=r"pip install 'mmc\[tracing\]' "
                                                   "opentelemetry-exporter-otlp-proto-grpc$"):
        tracing.require_packages(grpc)
    with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER: 'zipkin'"):
        tracing.exporter_from_env({"OTEL_TRACES_EXPORTER": "zipkin"})


def test_the_json_log_format_without_its_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "pythonjsonlogger.json", None)
    missing = r"python-json-logger is not installed: pip install 'mmc\[json-logs\]'"
    with pytest.raises(logs.MissingLogPackage, match=missing):
        logs.line_format({"MMC_LOG_FORMAT": "json"})
    with pytest.raises(ValueError, match="MMC_LOG_FORMAT='xml'"):
        logs.line_format({"MMC_LOG_FORMAT": "xml"})


def test_log_settings_switch_each_level_of_the_process_loggers(caplog):
    import logging

    control = LogControl(LogSettings.from_level("warning"))
    root = logging.getLogger()
    before = root.level, logging.getLogger("serving").level
    # a library's logger that keeps the level it inherits (in this test process another
    # library may have set urllib3's own level, which no setting here overrides)
    library = logging.getLogger("a_library_of_the_replica")
    try:
        control.update({"log_info": False, "log_warning": False, "log_verbose_level": 1})
        assert root.level == logging.ERROR
        assert logging.getLogger("serving").isEnabledFor(logging.DEBUG)
        assert not library.isEnabledFor(logging.DEBUG)
        assert [control.settings.allows(level) for level in (
            logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR)] == \
            [True, False, False, True]
        control.update({"log_verbose_level": 2})
        assert library.isEnabledFor(logging.DEBUG)
    finally:
        for handler in root.handlers:
            handler.removeFilter(control._filter)
        root.setLevel(before[0])
        logging.getLogger("serving").setLevel(before[1])
        for name in logs.OWN_LOGGERS:
            logging.getLogger(name).setLevel(logging.NOTSET)


# -- who may change them --------------------------------------------------------------------------


class _SaysNothing:
    """A source that does not say who may operate the replica."""


def test_a_replica_whose_source_says_nothing_refuses_changes_but_answers_reads():
    dataplane = DataPlane(replica="r")
    dataplane.source = _SaysNothing()
    dataplane.started = True
    assert dataplane.operator.log_settings()["log_file"] == ""
    with pytest.raises(Forbidden, match="changing the log settings is not offered"):
        asyncio.run(dataplane.operator.change_log_settings({"log_info": True}, None))
    with pytest.raises(Forbidden, match="changing the trace settings"):
        asyncio.run(dataplane.operator.change_trace_settings({"trace_rate": "2"}, None))


@pytest.mark.django_db(transaction=True)
def test_a_replica_of_the_registry_takes_changes_from_an_engineers_token_only(
        users, tmp_path):
    from registry.audit import Actor
    from registry.services import token_create
    from tests.conftest import CLUSTERED
    from tests.replicas import replicas, wait_until

    def bearer(role: str) -> dict:
        _, raw = token_create(username=role, name=f"{role}-ops", actor=Actor.system("t"))
        return {"authorization": f"Bearer {raw}"}

    engineer, viewer = bearer("engineer"), bearer("viewer")
    with replicas(1, embedded=not CLUSTERED, log_dir=tmp_path, grpc=True) as (rep,):
        http = thttp.InferenceServerClient(rep.url.removeprefix("http://"))
        client = tgrpc.InferenceServerClient(rep.grpc_address)
        wait_until(client.is_server_live, what="gRPC live")
        assert "log_info" in http.get_log_settings()  # reading needs no token
        error = _http_refusal(http.update_log_settings, {"log_info": True})
        assert error.status() == "401" and "Bearer" in error.message()
        error = _http_refusal(http.update_trace_settings, settings={"trace_rate": "5"},
                              headers=viewer)
        assert error.status() == "403" and "engineer" in error.message()
        error = _http_refusal(client.update_log_settings, {"log_info": True}, headers=viewer)
        assert error.status() == "StatusCode.PERMISSION_DENIED"
        error = _http_refusal(client.update_trace_settings, settings={"trace_rate": "5"})
        assert error.status() == "StatusCode.UNAUTHENTICATED"
        assert http.update_log_settings({"log_info": True}, headers=engineer)["log_info"]
        answer = client.update_trace_settings(settings={"trace_rate": "5"}, headers=engineer,
                                              as_json=True)
        assert answer["settings"]["trace_rate"]["value"] == ["5"]


# -- the console ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_console_traces_a_request_and_logs_it_as_json_with_its_ids(
        users, tmp_path, receiver):
    """Embedded console with OTEL_* set: Django's instrumentation makes the API request a span
    of the caller's trace; its JSON log line (Django's "Not Found") carries both ids."""
    from tests.conftest import CLUSTERED
    from tests.replicas import replicas

    if CLUSTERED:
        pytest.skip("the console process is started embedded only")
    traceparent, trace_id, caller_span = _traceparent()
    with replicas(1, embedded=True, log_dir=tmp_path, MMC_LOG_FORMAT="json",
                  OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, OTEL_BSP_SCHEDULE_DELAY="50",
                  LOG_LEVEL="INFO") as (console,):
        r = httpx.get(f"{console.url}/api/v1/no-such-thing/",
                      headers={"traceparent": traceparent, "X-Request-Id": "console-1"})
        assert r.status_code == 404 and r.headers["x-request-id"] == "console-1"
        spans = receiver.trace(trace_id, 1)
        assert spans and spans[0]["parent"] == caller_span and spans[0]["kind"] == 2
        deadline, found = time.time() + 10, []
        while not found and time.time() < deadline:
            found = [json.loads(line) for line in console.log.read_text().splitlines()
                     if line.startswith("{") and '"console-1"' in line]
            time.sleep(0.1)
    assert found, console.log.read_text()[-2000:]
    assert found[0]["request_id"] == "console-1" and found[0]["trace_id"] == trace_id
    assert found[0]["logger"] == "django.request" and found[0]["level"] == "WARNING"


@pytest.mark.django_db(transaction=True)
def test_a_replica_following_the_control_plane_asks_it_whose_token_it_is(users, tmp_path):
    """Over HTTP, with no database: the control plane says who the token is (GET /api/v1/me/)."""
    from registry.audit import Actor
    from registry.services import token_create
    from registry.services.replicas import credential_create
    from tests.replicas import following

    def bearer(role: str, **options) -> dict:
        _, raw = token_create(username=role, name=f"{role}-{uuid.uuid4().hex[:8]}",
                              actor=Actor.system("t"), **options)
        return {"Authorization": f"Bearer {raw}"}

    _, credential = credential_create(name="fleet", actor=Actor.system("spec"))
    with following(1, log_dir=tmp_path, token=credential) as (_, (rep,)):
        url = f"{rep.url}/v2/logging"
        assert httpx.post(url, json={"log_info": True}).status_code == 401
        refused = httpx.post(url, json={"log_info": True}, headers=bearer("viewer"))
        assert refused.status_code == 403 and "engineer" in refused.json()["error"]
        refused = httpx.post(url, json={"log_info": True},
                             headers=bearer("engineer", read_only=True))
        assert refused.status_code == 403 and "read-only" in refused.json()["error"]
        r = httpx.post(url, json={"log_info": True}, headers=bearer("engineer"))
        assert r.status_code == 200 and r.json()["log_info"] is True
        r = httpx.post(f"{rep.url}/v2/trace/setting", json={"trace_rate": "4"},
                       headers=bearer("admin"))
        assert r.status_code == 200 and r.json()["trace_rate"] == "4"
