"""Data capture, end to end: settings per endpoint (API, validated, audited, shipped with the
route table to replicas), capture off the request path on real replicas (a full queue drops and
counts, never fails a request), records in the artifact store readable with capture_store, the
replica API's ingest for replicas that follow over HTTP, and retention by the periodic GC."""

from __future__ import annotations

import gzip
import os
import random
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from registry import samples, services
from registry.audit import Actor
from registry.models import AuditEvent, Endpoint, ReplicaHeartbeat
from registry.monitoring import capture_store
from registry.monitoring.capture import prune_capture
from registry.serving_source import build_desired_state
from serving.core import capture_files, capture_wire
from serving.core.batch_policy import merge_inputs, split_outputs
from serving.core.capture import CaptureQueue, CaptureSettings
from serving.core.capture_wire import BATCH, HAS_INPUTS, HAS_OUTPUTS, RECORD, TRUNCATED
from serving.core.state_wire import decode_desired, encode_desired
from tests.conftest import REPO
from tests.replicas import following, replicas, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
SYSTEM = Actor.system("test")
ROW = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}


def put(client, model: str, **values):
    return client.put(f"/api/v1/models/{model}/endpoint/capture/", values, format="json")


def recent(model: str, **filters) -> list[dict]:
    return list(capture_store.iter_records(model, since=time.time() - 3600, **filters))


def encoder_processes(parent: int) -> list[int]:
    """The capture encoder processes `parent` started."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2:].split()[1]) == parent and \
                b"serving.core.capture_encoder" in cmdline:
            found.append(int(stat.parent.name))
    return found


def version_state(replica: str, key: str) -> dict:
    versions = ReplicaHeartbeat.objects.filter(replica=replica).values_list(
        "versions", flat=True).first() or {}
    return versions.get(key) or {}


# -- settings ---------------------------------------------------------------------------------

def test_capture_settings_out_of_range_are_400s_naming_the_field_and_write_nothing(
        engineer, client_for, ready_model):
    ready_model("cap", samples.mlp())
    services.endpoint_deploy(model_name="cap", version_number=1, actor=SYSTEM)
    revision = Endpoint.objects.get(model__name="cap").revision
    for body, field in [({"percent": 101}, "percent"), ({"percent": -0.5}, "percent"),
                        ({"percent": "lots"}, "percent"), ({"percent": 0.0001}, "percent"),
                        ({"percent": True}, "percent"), ({"mode": "tensors"}, "mode"),
                        ({"max_bytes": -1}, "max_bytes"), ({"max_bytes": 2**40}, "max_bytes"),
                        ({"retention_days": 0}, "retention_days"),
                        ({"retention_days": 1.5}, "retention_days"),
                        ({"percent": 10, "samples": 3}, "samples"),
                        ({"percent": 10, "mode": "neither"}, "mode")]:
        r = put(engineer, "cap", **body)
        assert r.status_code == 400, (body, r.content)
        assert field in r.content.decode(), (body, r.content)
    ep = Endpoint.objects.get(model__name="cap")
    assert (ep.revision, float(ep.capture_percent)) == (revision, 0.0)
    assert not AuditEvent.objects.filter(action="endpoint.capture").exists()
    assert put(client_for("viewer"), "cap", percent=10).status_code == 403
    assert client_for("viewer").get("/api/v1/models/cap/endpoint/capture/").status_code == 200

    r = put(engineer, "cap", percent=12.5, mode="outputs", max_bytes=1024, retention_days=7,
            reason="watch the new features")
    assert r.status_code == 200, r.content
    body = r.json()
    assert (body["percent"], body["mode"], body["max_bytes"], body["retention_days"]) == (
        12.5, "outputs", 1024, 7)
    assert body["enabled"] is True
    event = AuditEvent.objects.get(action="endpoint.capture")
    assert event.before == {"percent": 0.0, "mode": "both", "max_bytes": 65536,
                            "retention_days": 30}
    assert event.after == {"percent": 12.5, "mode": "outputs", "max_bytes": 1024,
                           "retention_days": 7}
    assert event.reason == "watch the new features"
    assert Endpoint.objects.get(model__name="cap").revision > revision
    assert put(engineer, "cap", percent=12.5).status_code == 200  # unchanged: no second event
    assert AuditEvent.objects.filter(action="endpoint.capture").count() == 1
    # shipped with the route table, and across the wire to replicas that follow over HTTP
    route = build_desired_state().routes["cap"]
    assert route.capture == CaptureSettings(percent=12.5, mode="outputs", max_bytes=1024)
    wired = decode_desired(encode_desired(build_desired_state()), artifact_path=str)
    assert wired.routes["cap"].capture == route.capture


def entry(request_id: str | None = "r1", *, inputs=None, outputs=None, mode: str = "both",
          cap: int = 65536, model: str = "m", version: str = "2", role: str = "stable",
          ts: float = 1764943200.5) -> tuple:
    """One queue entry as CaptureQueue.offer makes it (the mode drops a part there)."""
    return (ts, request_id, model, version, role, 1.23456,
            None if mode == "outputs" else inputs, None if mode == "inputs" else outputs,
            cap, False, 0)


def read_back(entries: list[tuple]) -> list[dict]:
    """Entries through the replica's encoding and capture_store's reading, as stored."""
    files, failed = capture_files.encode(entries, new_id=lambda: "given-id", pause=lambda: None)
    assert not failed
    return [r for f in files for r in capture_store.decode(f.payload)]


def test_a_record_keeps_its_mode_and_cuts_tensors_at_the_byte_cap():
    x = {"x": np.ones((1, 64), np.float32)}  # 256 bytes
    y = {"y": np.arange(10, dtype=np.float32).reshape(1, 10)}  # 40 bytes
    both, cut, only = read_back([
        entry("r1", inputs=x, outputs=y, cap=4096),
        entry(None, inputs=x, outputs=y, cap=100, role="pinned"),
        entry("r3", inputs=x, outputs=y, mode="outputs")])
    assert (both["id"], both["version"], both["truncated"]) == ("r1", 2, False)
    assert both["inputs"]["x"] == {"datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}
    assert both["outputs"]["y"]["data"] == list(range(10)) and both["latency_ms"] == 1.235
    assert cut["truncated"] is True and cut["inputs"] == {} and "y" in cut["outputs"]
    assert cut["id"] == "given-id" and cut["role"] == "pinned"  # an id given when it had none
    assert "inputs" not in only and "y" in only["outputs"] and not only["truncated"]
    # the cap is spent in the record's order: inputs first, a tensor that no longer fits is
    # left out and a smaller one after it still kept
    (order,) = read_back([entry("r4", inputs={"a": np.ones(10, np.int8),
                                              "b": np.ones(20, np.int8)},
                                outputs={"c": np.ones(5, np.int8)}, cap=16)])
    assert (list(order["inputs"]), list(order["outputs"]), order["truncated"]) == (
        ["a"], ["c"], True)


def test_every_datatype_and_shape_round_trips_through_a_capture_file():
    rng = np.random.default_rng(3)
    cases = {
        "f32": rng.standard_normal((2, 5)).astype(np.float32),
        "f64": rng.standard_normal((3, 4))[:, ::2],  # not contiguous
        "f16": rng.standard_normal(4).astype(np.float16),
        "b": np.array([[True, False, True]]),
        "i8": np.array([-128, 0, 127], np.int8), "i16": np.array([-3, 4], np.int16),
        "i32": np.arange(6, dtype=np.int32).reshape(2, 3),
        "i64": np.array([-(2**62), 2**62], np.int64),
        "u8": np.array([0, 255], np.uint8), "u16": np.arange(3, dtype=np.uint16),
        "u32": np.array([2**32 - 1], np.uint32), "u64": np.array([2**64 - 1], np.uint64),
        "big_endian": np.arange(3, dtype=">i4"),
        "scalar": np.array(2.5, np.float32), "empty": np.zeros((0, 3), np.float32),
        "s": np.array([b"ab", "c\u00e9", b"\xff"], dtype=object),  # BYTES
        "text": np.array(["one", "two"]), "x.shape": np.ones(2, np.float32),
        "x": np.arange(4, dtype=np.float32).reshape(2, 2)}
    datatypes = {"f32": "FP32", "f64": "FP64", "f16": "FP16", "b": "BOOL", "i8": "INT8",
                 "i16": "INT16", "i32": "INT32", "i64": "INT64", "u8": "UINT8",
                 "u16": "UINT16", "u32": "UINT32", "u64": "UINT64", "big_endian": "INT32",
                 "scalar": "FP32", "empty": "FP32", "s": "BYTES", "text": "BYTES",
                 "x.shape": "FP32", "x": "FP32"}
    (record,) = read_back([entry(inputs=cases, outputs={"y": cases["u64"]})])
    for name, array in cases.items():
        got = record["inputs"][name]
        assert got["datatype"] == datatypes[name], name
        assert got["shape"] == list(array.shape), name
        want = ["ab", "c\u00e9", "\ufffd"] if name == "s" else array.ravel().tolist()
        assert got["data"] == want, name
    assert record["outputs"]["y"]["data"] == [2**64 - 1]
    # shapes that change from record to record share a column; a tensor whose dtype changes
    # goes to a file of its own; a tensor this format cannot hold loses its record only
    files, failed = capture_files.encode([
        entry("a", inputs={"x": np.ones((1, 3), np.float32)}),
        entry("b", inputs={"x": np.ones((4, 3), np.float32)}, outputs={"y": np.ones(2)}),
        entry("c", inputs={"x": np.ones((2, 2), np.float64)}),
        entry("d", inputs={"z": np.ones(2, np.complex64)}),
        entry("e", inputs={"x": np.ones(5, np.float32)})], new_id=str, pause=lambda: None)
    assert [e[1] for e in failed] == ["d"]
    by_file = [[(r["id"], r["inputs"]["x"]["shape"], r["inputs"]["x"]["datatype"])
                for r in capture_store.decode(f.payload)] for f in files]
    assert by_file == [[("a", [1, 3], "FP32"), ("b", [4, 3], "FP32"), ("e", [5], "FP32")],
                       [("c", [2, 2], "FP64")]]
    assert [f.versions for f in files] == [{"2": 3}, {"2": 1}]
    # one file per model and hour
    files, _ = capture_files.encode([entry("h1", ts=1764943200.5), entry("h2", ts=1764946800.5),
                                     entry("h3", ts=1764943300.0, model="other"),
                                     entry("h4", ts=1764943201.0)], new_id=str, pause=lambda: None)
    assert [(f.model, f.first_ts, f.rows) for f in files] == [
        ("m", 1764943200.5, 2), ("m", 1764946800.5, 1), ("other", 1764943300.0, 1)]


def test_a_capture_file_is_one_line_away_from_a_data_frame(tmp_path):
    import pandas as pd

    from serving.core.capture import FolderCaptureSink

    sink = FolderCaptureSink(tmp_path)
    x = np.arange(64, dtype=np.float32).reshape(1, 64)
    files, _ = capture_files.encode([entry(f"r{i}", inputs={"x": x + i}) for i in range(3)],
                                    new_id=str, pause=lambda: None)
    sink(files[0])
    (path,) = tmp_path.glob("capture/m/2025-12-05/14/*.parquet")
    df = pd.read_parquet(path.parent)  # the hour folder
    assert list(df["id"]) == ["r0", "r1", "r2"] and list(df["version"]) == ["2"] * 3
    assert np.stack(df["inputs.x"]).shape == (3, 64) and df["inputs.x"][2][0] == 2.0
    assert list(df["inputs.x.shape"][0]) == [1, 64] and list(df["mode"]) == ["inputs"] * 3


@pytest.mark.parametrize("encoder", ["process", "thread"])
def test_a_replica_never_loads_pyarrow_for_capture_files_nor_pandas_anywhere(encoder):
    import importlib.util
    import subprocess
    import sys

    # pandas is installed here (the docs open capture files with it): pyarrow's first
    # pa.array() would import it (~1 s with the GIL held in a serving process, ~40 MB). With
    # the encoder process, the replica's own interpreter never loads pyarrow at all; with the
    # encoder in a thread (MMC_CAPTURE_ENCODER=thread) it loads it on the first flush, and
    # never pandas (the encoder process makes its files with the same code)
    assert importlib.util.find_spec("pandas") is not None
    code = ("import sys, time, numpy as np\n"
            "import serving.http.app\n"
            "from serving.core.capture import CaptureQueue, CaptureSettings\n"
            f"q = CaptureQueue(lambda f: None, flush_s=3600, encoder={encoder!r})\n"
            "q.start = lambda: None\n"
            "q.offer(request_id=None, model='m', version='1', role='stable', latency_ms=1.0,\n"
            "        inputs={'x': np.ones(2)}, outputs=None, settings=CaptureSettings(100))\n"
            "print('pyarrow' in sys.modules, end=' ')\n"
            "print(q.flush(), 'pyarrow' in sys.modules, 'pandas' in sys.modules, end=' ')\n"
            "q.stop()\n"
            "from registry.monitoring import capture_store\n"
            "import pandas\n"  # a user's own import still works afterwards
            "print(pandas.__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=str(REPO))
    loaded = "True" if encoder == "thread" else "False"
    assert out.stdout.strip() == f"False 1 {loaded} False pandas", out.stderr[-2000:]


@pytest.mark.parametrize("encoder", ["process", "thread"])
def test_records_offered_to_the_queue_read_back_as_written_by_either_encoder(encoder):
    rng = np.random.default_rng(5)
    stored: list[capture_files.CaptureFile] = []
    queue = CaptureQueue(stored.append, flush_s=3600, encoder=encoder)
    queue.start = lambda: None

    def offer(request_id, inputs, outputs=None, mode="both", cap=65536, version="2"):
        assert queue.offer(request_id=request_id, model="m", version=version, role="stable",
                           latency_ms=1.23456, inputs=inputs, outputs=outputs,
                           settings=CaptureSettings(100, mode, cap))

    cases = {
        "f32": rng.standard_normal((2, 5)).astype(np.float32),
        "f64": rng.standard_normal((3, 4))[:, ::2],  # not contiguous
        "b": np.array([[True, False, True]]), "i8": np.array([-128, 0, 127], np.int8),
        "u64": np.array([2**64 - 1], np.uint64), "big_endian": np.arange(3, dtype=">i4"),
        "scalar": np.array(2.5, np.float32), "empty": np.zeros((0, 3), np.float32),
        "s": np.array([b"ab", "c\u00e9", b"\xff"], dtype=object), "text": np.array(["one"]),
        "listed": [1.5, 2.5]}  # not an array: taken as numpy takes it
    y = {"y": np.arange(10, dtype=np.float32).reshape(1, 10)}
    offer("all", cases, y)
    x = np.arange(64, dtype=np.float32).reshape(1, 64)
    offer("same-kind-1", {"x": x}, y)  # the first of its kind, then the usual way
    offer("same-kind-2", {"x": x + 1}, y)
    offer("strided", {"x": np.arange(128, dtype=np.float32).reshape(1, 128)[:, ::2]}, y)
    offer(None, {"x": x}, y, mode="outputs")
    offer("cap", {"a": np.ones(10, np.int8), "b": np.ones(20, np.int8)},
          {"c": np.ones(5, np.int8)}, cap=16)
    offer("other-dtype", {"x": x.astype(np.float64)}, version="3")
    long_id = "\u00e9" * 40000  # longer than a record's id field: kept, cut
    offer(long_id, {"x": x})
    assert queue.depth == 8 and queue.flush() == 8
    got = {r["id"]: r for f in stored for r in capture_store.decode(f.payload)}
    # each record reads back as the same entry written straight through capture_files does
    (want,) = read_back([entry("all", inputs={k: np.asarray(v) for k, v in cases.items()},
                               outputs=y)])
    assert got["all"]["inputs"] == want["inputs"] and got["all"]["outputs"] == want["outputs"]
    assert got["all"]["latency_ms"] == 1.235 and got["all"]["truncated"] is False
    assert got["same-kind-2"]["inputs"]["x"]["data"] == (x + 1).ravel().tolist()
    assert got["strided"]["inputs"]["x"]["data"] == list(range(0, 128, 2))
    (generated,) = [r for i, r in got.items() if i not in (
        "all", "same-kind-1", "same-kind-2", "strided", "cap", "other-dtype", long_id[:1024])]
    assert "inputs" not in generated and len(generated["id"]) == 24
    assert (list(got["cap"]["inputs"]), list(got["cap"]["outputs"]), got["cap"]["truncated"]
            ) == (["a"], ["c"], True)
    assert got["other-dtype"]["inputs"]["x"]["datatype"] == "FP64"
    assert got["other-dtype"]["version"] == 3
    assert got[long_id[:1024]]["inputs"]["x"]["data"] == x.ravel().tolist()
    assert queue.snapshot("m", "2") == {"captured": 7, "dropped": 0, "written": 7, "failed": 0}
    # a tensor the format cannot hold: that record counted failed, the next one written
    offer("complex", {"z": np.ones(2, np.complex64)})
    offer("fine", {"x": x})
    assert queue.flush() == 1
    assert queue.snapshot("m", "2") == {"captured": 9, "dropped": 0, "written": 8, "failed": 1}
    queue.stop()


def records_in(buf) -> list[int]:
    """The flags of each record packed in a queue's buffer (serving.core.capture_wire)."""
    flags, at = [], 0
    while at < len(buf):
        length, _, _, flag, *_ = RECORD.unpack_from(buf, at)
        flags.append(flag)
        at += length
    assert at == len(buf)
    return flags


@pytest.mark.parametrize("encoder", ["process", "thread"])
def test_a_batchers_run_is_packed_once_and_reads_back_as_each_request_alone(encoder):
    rng = np.random.default_rng(11)
    stored: list[capture_files.CaptureFile] = []
    queue = CaptureQueue(stored.append, flush_s=3600, encoder=encoder)
    queue.start = lambda: None
    runs: list[tuple] = []

    def run(rows, ids, *, roles=None, settings=None, budget=1 << 20, text=False,
            sampled=None):
        """One run of the batcher: each request's own inputs, the joined feeds, the model's
        joined outputs split back; offered as the batcher offers it. Returns the flags of
        the records it packed."""
        settings = settings or CaptureSettings(100)
        inputs = [{"x": rng.standard_normal((n, 4)).astype(np.float32),
                   "k": rng.integers(0, 99, n).astype(np.int64)} for n in rows]
        feeds = merge_inputs(inputs)
        outputs = {"y": feeds["x"] * 2, "label": feeds["k"] % 3}
        if text:
            outputs["word"] = np.array([f"w{k}" for k in feeds["k"]], dtype=object)
        parts = split_outputs(outputs, rows)
        now = time.perf_counter_ns()
        tickets = [queue.ticket("m", "2", (roles or ["stable"] * len(rows))[i], rid,
                                now - (i + 1) * 5_000_000, settings, budget)
                   for i, rid in enumerate(ids)]
        if sampled is not None:
            tickets = [t if keep else None for t, keep in zip(tickets, sampled, strict=True)]
        before = len(queue._open.buf)
        queue.offer_batch(tickets, inputs, feeds, outputs, parts, rows)
        runs.append((tickets, inputs, parts, settings))
        return records_in(queue._open.buf[before:])

    # all sampled alike: one record for the run, whatever its size; an id may be missing
    assert run([1, 3, 2], ["a1", None, "a3"]) == [BATCH | HAS_INPUTS | HAS_OUTPUTS]
    assert run([2, 2], ["b1", "b2"], settings=CaptureSettings(100, "inputs")) == [
        BATCH | HAS_INPUTS]
    assert run([1, 2], ["\u00e9t\u00e9", "b\u00fc-\u4e2d"]) == [BATCH | HAS_INPUTS | HAS_OUTPUTS]
    # otherwise each sampled request alone, as the request path would have offered it
    assert run([1, 2, 1], ["c1", "c2", "c3"], sampled=[True, False, True]) == [6, 6]
    assert run([1, 1], ["d1", "d2"], roles=["stable", "pinned"]) == [6, 6]
    cap = CaptureSettings(100, "both", 100)  # 48 bytes a row: 3 rows pass the cap, 1 does not
    assert run([1, 3], ["e1", "e2"], settings=cap) == [6, 6 | TRUNCATED]
    assert run([1, 3], ["f1", "f2"], budget=50) == [6]  # f2's 72 output bytes: a 400, not kept
    assert run([2, 1], ["g1", "g2"], text=True) == [6, 6]
    assert queue.snapshot("m", "2") == {"captured": 16, "dropped": 0, "written": 0, "failed": 0}
    assert queue.flush() == 16
    got = {r["id"]: r for f in stored for r in capture_store.decode(f.payload)}
    (generated,) = [i for i in got if len(i) == 24]
    got["a2"] = got.pop(generated)
    assert sorted(got) == sorted(["a1", "a2", "a3", "b1", "b2", "c1", "c3", "d1", "d2", "e1",
                                  "e2", "f1", "g1", "g2", "\u00e9t\u00e9", "b\u00fc-\u4e2d"])
    for tickets, inputs, parts, settings in runs:
        for i, ticket in enumerate(tickets):
            if ticket is None or (ticket.request_id or "a2") not in got:
                continue
            record = got[ticket.request_id or "a2"]
            # the same record as that request's own tensors written straight through
            (want,) = read_back([entry(ticket.request_id, inputs=inputs[i], outputs=parts[i],
                                       mode=settings.mode, role=ticket.role)])
            if record["truncated"]:
                assert list(record["inputs"]) == ["x", "k"] and list(record["outputs"]) == [
                    "label"]
                assert record["outputs"]["label"] == want["outputs"]["label"]
            else:
                assert record.get("inputs") == want.get("inputs")
                assert record.get("outputs") == want.get("outputs")
            assert record["role"] == ticket.role and record["version"] == 2
            assert (i + 1) * 5 <= record["latency_ms"] < (i + 1) * 5 + 60_000
    assert got["e2"]["truncated"] and not got["e1"]["truncated"]
    assert got["g1"]["outputs"]["word"]["datatype"] == "BYTES"
    assert queue.snapshot("m", "2") == {"captured": 16, "dropped": 0, "written": 16,
                                        "failed": 0}
    # a full queue drops the run's records together, counted; an empty one takes them again
    queue.max_records = 2
    assert run([1, 1, 1], ["h1", "h2", "h3"]) == []
    assert queue.snapshot("m", "2")["dropped"] == 3
    queue.stop()


def test_a_regular_buffer_written_from_its_columns_makes_the_file_the_general_way_makes():
    rng = np.random.default_rng(3)
    queue = CaptureQueue(None, flush_s=3600)
    queue.start = lambda: None
    settings = CaptureSettings(100)

    def run(rows, *, model="m", word=False, order=">f4", ids=True, rank3=False, uid="r",
            version="4", role="candidate", cap=None):
        inputs = [{"x": rng.standard_normal((n, 3)).astype(np.float32),
                   "k": rng.integers(0, 9, (n, 2, 2) if not rank3 else (n, 2)
                                     ).astype(np.int16)} for n in rows]
        feeds = merge_inputs(inputs)
        outputs = {"y": feeds["x"].sum(axis=1, keepdims=True).astype(np.float64)}
        if word:
            outputs["w"] = np.array([str(v) for v in feeds["k"][:, 0]], dtype=object)
        if order != ">f4":
            outputs["z"] = feeds["x"].astype(order)
        tickets = [queue.ticket(model, version, role, f"{uid}{rng.integers(1 << 40)}" if ids
                                and (i or ids == "all") else None, time.perf_counter_ns(),
                                cap or settings, 1 << 20) for i in range(len(rows))]
        queue.offer_batch(tickets, inputs, feeds, outputs, split_outputs(outputs, rows), rows)

    def both(n_runs: list[dict]) -> tuple:
        queue._open = type(queue._open)()
        for kw in n_runs:
            run(**kw)
        buf = bytes(queue._open.buf)
        columns = capture_wire.columns(buf)
        ids = iter(f"given-{i}" for i in range(10**6))
        quick = None if columns is None else capture_files.encode_columns(
            columns, new_id=lambda: next(ids))
        ids = iter(f"given-{i}" for i in range(10**6))
        files, failed = capture_files.encode(capture_wire.unpack(buf),
                                             new_id=lambda: next(ids), pause=lambda: None)
        assert not failed
        return quick, files

    # runs of one row each, of several rows, requests alone (with and without an id, ids not
    # ASCII, every id given), two versions and roles in one buffer
    for runs in ([{"rows": [1, 1, 1, 1]}, {"rows": [2, 1, 3]}, {"rows": [1]},
                  {"rows": [1, 1], "ids": False}],
                 [{"rows": [1]}, {"rows": [1], "ids": False}, {"rows": [3]}, {"rows": [2, 1]}],
                 [{"rows": [1, 1, 1], "ids": "all"}, {"rows": [2], "ids": "all"}],
                 [{"rows": [1, 2], "uid": "\u00e9t\u00e9-"}, {"rows": [2], "version": "5"},
                  {"rows": [1, 1], "role": "stable", "version": "5"}]):
        quick, (general,) = both(runs)
        n = sum(len(r["rows"]) for r in runs)
        assert quick is not None and sum(quick.versions.values()) == n, runs
        assert quick.versions == general.versions
        assert capture_store.decode(quick.payload) == capture_store.decode(general.payload)
        assert pq_schema(quick.payload) == pq_schema(general.payload)
        assert quick.first_ts == general.first_ts and quick.model == general.model
    # the general way: text, a byte order not native, two models, tensors of another rank,
    # a record cut by the byte cap, bytes that are not records
    cap = CaptureSettings(100, "both", 40)
    for runs in ([{"rows": [1, 1], "word": True}], [{"rows": [1, 1], "order": ">f8"}],
                 [{"rows": [1, 1]}, {"rows": [1, 1], "model": "other"}],
                 [{"rows": [1, 1]}, {"rows": [1], "rank3": True}],
                 [{"rows": [1, 1]}, {"rows": [1, 3], "cap": cap}]):
        quick, files = both(runs)
        assert quick is None and sum(f.rows for f in files) == sum(
            len(r["rows"]) for r in runs), runs
    queue._open = type(queue._open)()
    run([2, 1])
    run([1, 1])
    run([1])
    whole = bytes(queue._open.buf)
    assert capture_wire.columns(whole) is not None
    (first,) = struct.unpack_from("<I", whole)
    longer = struct.pack("<I", first + 1) + whole[4:]
    more_rows = bytearray(whole)  # the first run's first request: 3 rows where it held 2
    more_rows[RECORD.size + 8] = 3
    moved = bytearray(more_rows)  # and the second's first none: as many rows in all
    moved[first + RECORD.size + 8] = 0
    for broken in (whole[:-1], whole + b"\0", longer, bytes(more_rows), bytes(moved)):
        assert capture_wire.columns(broken) is None
        with pytest.raises(ValueError):
            capture_wire.unpack(broken)
    assert capture_wire.columns(b"") is None


def pq_schema(payload: bytes):
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pq.read_schema(pa.BufferReader(payload))


def test_a_replica_captures_each_request_of_a_batch_with_its_own_rows_and_id(tmp_path):
    from registry.store.artifacts import FileStore
    from tests.serving.test_app import Server, write_model

    write_model(tmp_path / "models", "mlp", "1", samples.mlp(), config={
        "max_batch_size": 8, "max_queue_delay_us": 3000, "capture": {"percent": 100}})
    # answers from the response cache never reach a batcher: captured on their own
    write_model(tmp_path / "models", "cached", "1", samples.mlp(seed=4), config={
        "response_cache": True, "capture": {"percent": 100}})
    server = Server(tmp_path / "models", MMC_CAPTURE_DIR=str(tmp_path / "capture"),
                    MMC_CAPTURE_FLUSH_SECONDS="0.2")
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=30) as http:
            def call(i: int) -> tuple[str, list]:
                body = {"inputs": [{"name": "x", "shape": [1 + i % 2, 64], "datatype": "FP32",
                                    "data": [i / 10] * 64 * (1 + i % 2)}]}
                r = http.post("/v2/models/mlp/infer", json=body,
                              headers={"x-request-id": f"req-{i}"} if i % 5 else {})
                assert r.status_code == 200, r.text
                return r.headers["x-request-id"], r.json()["outputs"][0]["data"]

            with ThreadPoolExecutor(16) as pool:
                answers = dict(pool.map(call, range(160)))
            cached = [http.post("/v2/models/cached/infer", json=ROW) for _ in range(3)]
            assert [r.status_code for r in cached] == [200] * 3
            metrics = http.get("/metrics").text
        runs = counter_value(metrics, "nv_inference_exec_count", "mlp")
        assert counter_value(metrics, "nv_inference_request_success", "mlp") == 160
        assert runs < 150, "the requests were not batched: no run took two"
        assert counter_value(metrics, "nv_cache_num_hits_per_model", "cached") == 2
        store = FileStore(tmp_path / "capture", 10**9)
        records = wait_until(lambda: len(r := list(capture_store.iter_records(
            "mlp", since=time.time() - 300, store=store))) == 160 and r, timeout=30,
            what="160 records stored")
        hits = wait_until(lambda: len(r := list(capture_store.iter_records(
            "cached", since=time.time() - 300, store=store))) == 3 and r, timeout=30,
            what="3 records of the cached model stored")
    finally:
        server.stop()
    assert {r["id"] for r in hits} == {r.headers["x-request-id"] for r in cached}
    for r, answer in zip(sorted(hits, key=lambda r: r["ts"]), cached, strict=True):
        assert r["outputs"]["y"]["data"] == pytest.approx(answer.json()["outputs"][0]["data"])
        assert r["inputs"]["x"]["data"] == [0.5] * 64
    assert {r["id"] for r in records} == set(answers)
    for r in records:  # each record holds its own request's rows and its own answer
        rows = r["inputs"]["x"]["shape"][0]
        assert r["outputs"]
        (out,) = r["outputs"].values()
        assert out["data"] == pytest.approx(answers[r["id"]], rel=1e-6)
        data = r["inputs"]["x"]["data"]
        assert len(data) == 64 * rows and len(set(data)) == 1
        if r["id"].startswith("req-"):  # (the others: ids the replica gave, returned)
            i = int(r["id"][4:])
            assert data[0] == pytest.approx(i / 10) and rows == 1 + i % 2


def counter_value(metrics: str, name: str, model: str = "") -> float:
    """A metric summed over its series (of one model's, given one)."""
    label = f'model="{model}"' if model else ""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith(name + "{") and label in line)


def test_the_encoder_process_answers_batch_after_batch_and_one_that_dies_costs_its_batch():
    import signal
    import subprocess
    import sys

    from serving.core import capture_encoder

    stored: list = []
    queue = CaptureQueue(stored.append, flush_s=3600)
    queue.start = lambda: None
    x = {"x": np.ones((1, 4), np.float32)}

    def offer(n: int) -> None:
        for _ in range(n):
            queue.offer(request_id=None, model="m", version="1", role="stable", latency_ms=1.0,
                        inputs=x, outputs=None, settings=CaptureSettings(100))

    offer(3)
    assert queue.flush() == 3
    encoder = queue._process
    pid = encoder.pid
    assert pid and pid != os.getpid()
    offer(2)
    assert queue.flush() == 2 and encoder.pid == pid  # one process, batch after batch
    # every thread of it below the serving process (pyarrow's started before it lowered itself)
    threads = list(Path(f"/proc/{pid}/task").iterdir())
    assert len(threads) > 1 and {os.getpriority(os.PRIO_PROCESS, int(t.name))
                                 for t in threads} == {capture_encoder.NICE}
    # bytes that are not records: that batch refused with the reason, the process goes on
    with pytest.raises(capture_encoder.EncoderFailed, match="capture record"):
        encoder.encode(b"\x40\x00\x00\x00" + b"\x00" * 60)
    assert encoder.pid == pid
    os.kill(pid, signal.SIGKILL)  # one killed between batches is started again
    wait_until(lambda: encoder._proc.poll() is not None, timeout=30, what="the kill")
    offer(1)
    assert queue.flush() == 1 and encoder.pid not in (None, pid)
    # one that dies while it holds a batch: those records counted failed, and no more
    encoder.close()
    encoder._proc = subprocess.Popen(  # reads the batch's length, then exits
        [sys.executable, "-c", "import sys; sys.stdin.buffer.read(8)"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    offer(4)
    assert queue.flush() == 0 and encoder.pid is None
    assert queue.snapshot("m", "1") == {"captured": 10, "dropped": 0, "written": 6, "failed": 4}
    offer(1)
    assert queue.flush() == 1 and queue.snapshot("m", "1")["written"] == 7
    last = encoder.pid
    queue.stop()  # the graceful stop ends the encoder process
    wait_until(lambda: not os.path.exists(f"/proc/{last}"), timeout=30, what="encoder gone")


def test_the_flusher_writes_whole_batches_under_steady_traffic_and_the_rest_on_its_tick():
    import threading

    files: list = []
    writing, written = threading.Event(), threading.Event()

    def slow_sink(file) -> None:  # records keep arriving while a file is written
        writing.set()
        time.sleep(0.3)
        files.append(file)
        written.set()

    queue = CaptureQueue(slow_sink, flush_s=3.0, batch=100)
    x = {"x": np.ones((1, 4), np.float32)}

    def offer(n: int) -> None:
        for _ in range(n):
            assert queue.offer(request_id=None, model="m", version="1", role="stable",
                               latency_ms=1.0, inputs=x, outputs=None,
                               settings=CaptureSettings(100))

    offer(100)  # a whole batch wakes the flusher
    assert writing.wait(30)
    offer(30)  # ... and these arrive while it writes: they wait for the next batch or the tick
    assert written.wait(30)
    time.sleep(0.5)
    assert [f.rows for f in files] == [100] and queue.depth == 30
    wait_until(lambda: sum(f.rows for f in files) == 130, timeout=30, what="the tick's flush")
    assert [f.rows for f in files] == [100, 30]
    queue.stop()


def test_records_flushed_to_a_folder_are_read_back_and_counted_per_version(tmp_path):
    from registry.store.artifacts import FileStore
    from serving.core.capture import FolderCaptureSink

    queue = CaptureQueue(FolderCaptureSink(tmp_path), flush_s=3600, batch=4)
    queue.start = lambda: None
    x, y = {"x": np.full((1, 64), 0.5, np.float32)}, {"y": np.arange(10, dtype=np.float32)}
    for i in range(10):
        assert queue.offer(request_id=f"q-{i}" if i else None, model="lines", version="2",
                           role="candidate", latency_ms=0.5, inputs=x, outputs=y,
                           settings=CaptureSettings(100, "both" if i % 2 else "outputs"))
    odd = {"x": np.arange(3, dtype=np.complex64)}  # no capture datatype: that record only lost
    queue.offer(request_id="odd", model="lines", version="2", role="stable", latency_ms=1.0,
                inputs=odd, outputs=None, settings=CaptureSettings(100))
    assert queue.flush() == 10
    assert queue.snapshot("lines", "2") == {"captured": 11, "dropped": 0, "written": 10,
                                            "failed": 1}
    store = FileStore(tmp_path, 10**9)
    got = list(capture_store.iter_records("lines", since=time.time() - 60, store=store))
    assert len(got) == 10 and len(got[0]["id"]) == 24
    assert [r["id"] for r in got[1:]] == [f"q-{i}" for i in range(1, 10)]
    assert got[1]["inputs"]["x"]["data"] == [0.5] * 64 and "inputs" not in got[2]
    assert got[2]["outputs"]["y"] == {"datatype": "FP32", "shape": [10],
                                      "data": list(range(10))}

    # a sink that fails loses its file's records, counted per version, and no more
    def broken(file):
        raise OSError("disk full")

    failing = CaptureQueue(broken, flush_s=3600, batch=2)
    failing.start = lambda: None
    for version in ("1", "1", "2"):
        failing.offer(request_id=None, model="m", version=version, role="stable",
                      latency_ms=1.0, inputs=x, outputs=None, settings=CaptureSettings(100))
    assert failing.flush() == 0
    assert [failing.snapshot("m", v)["failed"] for v in ("1", "2")] == [2, 1]


def test_a_full_queue_drops_and_counts_without_blocking():
    stored: list[dict] = []

    def sink(file: capture_files.CaptureFile) -> None:
        stored.extend(capture_store.decode(file.payload))

    queue = CaptureQueue(sink, max_records=3, max_bytes=10**9, flush_s=3600,
                         rnd=random.Random(1))
    queue.start = lambda: None  # no flusher thread: the spec flushes by hand
    x = {"x": np.ones((1, 4), np.float32)}
    offered = [queue.offer(request_id=str(i), model="m", version="1", role="stable",
                           latency_ms=1.0, inputs=x, outputs=x,
                           settings=CaptureSettings(100)) for i in range(5)]
    assert offered == [True, True, True, False, False]
    assert queue.snapshot("m", "1") == {"captured": 3, "dropped": 2, "written": 0, "failed": 0}
    assert queue.flush() == 3 and [r["id"] for r in stored] == ["0", "1", "2"]
    assert queue.snapshot("m", "1")["written"] == 3
    # bytes bound too: one record of 1 MB fits a 1.5 MB budget, the second does not
    small = CaptureQueue(sink, max_records=100, max_bytes=1_500_000, flush_s=3600)
    small.start = lambda: None
    big = {"x": np.ones((1, 250_000), np.float32)}
    assert [small.offer(request_id=None, model="m", version="1", role="stable",
                        latency_ms=1.0, inputs=big, outputs=None,
                        settings=CaptureSettings(100, "inputs", 2_000_000))
            for _ in range(2)] == [True, False]
    # sampling: about the share asked for
    sampler = CaptureQueue(sink, rnd=random.Random(7))
    hits = sum(sampler.sampled(CaptureSettings(10)) for _ in range(20000))
    assert 1700 < hits < 2300
    assert not sampler.sampled(CaptureSettings(0))


# -- real replicas ----------------------------------------------------------------------------

def test_capture_under_load_with_a_tiny_queue_drops_and_counts_never_failing_a_request(
        engineer, ready_model, tmp_path):
    ready_model("load", samples.mlp())
    ready_model("load", samples.mlp(seed=2))
    services.endpoint_deploy(model_name="load", version_number=1, actor=SYSTEM)
    services.canary_start(model_name="load", version_number=2, weight=50, actor=SYSTEM)
    assert put(engineer, "load", percent=100).status_code == 200
    # a queue of 8 emptied once a second (a batch of 1,000 is never full): drops whatever the
    # machine's speed, as 400 requests take far less than 50 s
    with replicas(1, embedded=True, log_dir=tmp_path, MMC_CAPTURE_QUEUE_RECORDS="8",
                  MMC_CAPTURE_FLUSH_SECONDS="1",
                  MMC_CAPTURE_BATCH_RECORDS="1000") as (rep,):
        wait_until(lambda: version_state(rep.name, "load:2").get("state") == "READY",
                   timeout=60, what="load:2 loaded")
        with httpx.Client(base_url=rep.url, timeout=30) as http:
            def call(i: int) -> int:
                headers = {"x-request-id": f"req-{i}"}
                path = "/v2/models/load/versions/1/infer" if i % 10 == 0 \
                    else "/v2/models/load/infer"
                return http.post(path, json=ROW, headers=headers).status_code

            with ThreadPoolExecutor(16) as pool:
                statuses = list(pool.map(call, range(400)))
            assert statuses == [200] * 400  # a full queue never fails a request
            metrics = http.get("/metrics").text
        dropped = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                      if line.startswith("mmc_capture_dropped_total{"))
        captured = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                       if line.startswith("mmc_capture_records_total{"))
        assert dropped > 0 and captured > 0 and captured + dropped == 400, metrics[-2000:]
        records = wait_until(lambda: (len(r := recent("load")) == captured) and r, timeout=30,
                             what=f"{captured:g} records stored")
        # the console's numbers come from heartbeats: they add up to the replica's
        body = wait_until(lambda: ((b := engineer.get(
            "/api/v1/models/load/endpoint/capture/").json())["dropped"] == dropped) and b,
            timeout=30, what="dropped reported")
        assert body["captured"] == captured
    roles = {(r["version"], r["role"]) for r in records}
    assert roles <= {(1, "stable"), (2, "candidate"), (1, "pinned")}
    assert (2, "candidate") in roles and (1, "stable") in roles
    for r in records:
        assert r["id"].startswith("req-") and r["model"] == "load" and not r["truncated"]
        assert r["inputs"]["x"]["data"] == [0.5] * 64 and r["latency_ms"] > 0
        assert r["role"] != "pinned" or int(r["id"][4:]) % 10 == 0
    assert len(recent("load", version=2, roles=["candidate"])) == sum(
        1 for r in records if r["version"] == 2)


def test_a_replica_that_follows_over_http_sends_its_capture_to_the_replica_api(
        engineer, ready_model, tmp_path):
    ready_model("far", samples.mlp())
    services.endpoint_deploy(model_name="far", version_number=1, actor=SYSTEM)
    assert put(engineer, "far", percent=100, mode="outputs").status_code == 200
    _, token = services_replica_credential()
    with following(1, log_dir=tmp_path, token=token, MMC_CAPTURE_FLUSH_SECONDS="0.3") as (
            plane, (rep,)):
        wait_until(lambda: version_state(rep.name, "far:1").get("state") == "READY",
                   timeout=60, what="far:1 loaded")
        with httpx.Client(base_url=rep.url, timeout=30) as http:
            for i in range(5):
                r = http.post("/v2/models/far/infer", json={**ROW, "id": f"body-{i}"})
                assert r.status_code == 200 and r.json()["id"] == f"body-{i}"
            r = http.post("/v2/models/far/infer", json=ROW)  # no id: capture gives it one
            given = r.headers["x-request-id"]
            assert r.status_code == 200 and len(given) == 24
        records = wait_until(lambda: (len(r := recent("far")) == 6) and r, timeout=30,
                             what="6 records through the replica API")
        assert sorted(r["id"] for r in records) == sorted(
            [f"body-{i}" for i in range(5)] + [given])
        assert all("inputs" not in r and "y" in r["outputs"] for r in records)
        url = f"{plane.url}/api/v1/replica/capture"
        good = good_file()
        auth = {"Authorization": f"Bearer {token}"}
        assert httpx.post(url, content=good, headers={"Authorization": "Bearer mmcr_x_y"}
                          ).status_code == 401
        assert httpx.post(url, content=good).status_code == 401
        r = httpx.post(url, content=b"\0" * (17 * 1024 * 1024), headers=auth)
        assert r.status_code == 413, r.text
        for bad, words in refused_files():
            r = httpx.post(url, content=bad, headers=auth)
            assert r.status_code == 400 and words in r.json()["error"], (words, r.text)
        assert len(recent("far")) == 6  # nothing refused was written
        assert httpx.post(url, content=good, headers=auth).status_code == 204
        assert [r["id"] for r in recent("far") if r["id"].startswith("sent-by-hand")] == [
            "sent-by-hand-0", "sent-by-hand-1"]


def good_file(model: str = "far", n: int = 2, **tensors) -> bytes:
    """A capture file as a replica sends it: `n` records of `model`, taken a second ago."""
    now = time.time() - 1
    tensors = tensors or {"y": np.arange(10, dtype=np.float32).reshape(1, 10)}
    files, _ = capture_files.encode([
        (now, f"sent-by-hand-{i}", model, "1", "stable", 1.5, None, tensors, 65536, False, 0)
        for i in range(n)], new_id=str, pause=lambda: None)
    return files[0].payload


def rewritten(payload: bytes, *, metadata: dict | None = None, dictionary: bool = False,
              **columns) -> bytes:
    """A capture file with columns replaced (name -> (field, array)) or its metadata changed,
    written as the writer writes it (no Arrow schema stored, no dictionary unless asked)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(pa.BufferReader(payload))
    for name, (field, array) in columns.items():
        table = table.set_column(table.schema.get_field_index(name), field, array)
    out = pa.BufferOutputStream()
    with pq.ParquetWriter(out, table.schema, compression="zstd", store_schema=False,
                          use_dictionary=dictionary) as writer:
        writer.write_table(table)
        writer.add_key_value_metadata(table.schema.metadata if metadata is None else metadata)
    return out.getvalue().to_pybytes()


def refused_files() -> list[tuple[bytes, str]]:
    """Payloads the replica API refuses, each with words its 400 says."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = good_file()
    meta = pq.read_schema(pa.BufferReader(good)).metadata
    out = pa.BufferOutputStream()
    pq.write_table(pa.table({"a": [1, 2]}), out)
    other = out.getvalue().to_pybytes()
    two = [pa.array(["stable", "boss"]), pa.array(["../etc"] * 2),
           pa.array(["now", "later"]), pa.array([[1, 10], [1, 11]], pa.list_(pa.int32()))]
    zeros = pa.ListArray.from_arrays(pa.array([0, 17_000_000, 17_000_010], pa.int32()),
                                     pa.array(np.zeros(17_000_010, np.int64)))
    bomb = rewritten(good, **{"outputs.y": (pa.field("outputs.y", zeros.type), zeros)})
    runs = rewritten(good, dictionary=True, **{"outputs.y": (pa.field("outputs.y", zeros.type),
                                                             zeros)})
    return [
        (b"anything else", "body: not a Parquet file"),
        (gzip.compress(b'{"id": "r1"}\n'), "body: gzip JSON Lines, from a replica older than "
                                           "this control plane; capture files are Parquet now"),
        (b"PAR1" + b"\xff" * 64 + b"PAR1", "body: unreadable Parquet footer"),
        (other, "schema: not a capture file of format 1"),
        (rewritten(good, role=(pa.field("role", pa.string(), nullable=False), two[0])),
         "role: 'boss' is not one of stable, candidate"),
        (rewritten(good, ts=(pa.field("ts", pa.string(), nullable=False), two[2])),
         "schema: ts must be double not null, not string not null"),
        (rewritten(good, model=(pa.field("model", pa.string(), nullable=False), two[1])),
         "model: '../etc' is not a model name"),
        (rewritten(good, **{"outputs.y.shape": (pa.field("outputs.y.shape", two[3].type),
                                                two[3])}),
         "outputs.y: row 2 has 10 values for a shape of 11"),
        (bomb, "body: more than 134217728 bytes once decompressed"),
        (good_file(n=20001), "body: more than 20000 records (20001)"),
        (runs, "body: column 'id' is encoded RLE_DICTIONARY; capture files use"),
        (rewritten(good, metadata={**meta, b"capture.tensors": b'{"outputs.y": '
                                                               b'["outputs", "y", "data"]}'}),
         "schema: capture.tensors must name every column after the first 8, once each"),
        (rewritten(good, metadata={**meta, b"capture.tensors": b"[1, 2"}),
         "schema: capture.tensors is not JSON"),
        (rewritten(good, metadata={
            **meta, b"capture.tensors": b'{"outputs.y": ["outputs", "y", "data"], '
                                        b'"outputs.y.shape": ["outputs", "z", "shape"]}'}),
         "schema: outputs.y needs a data and a shape column"),
        (rewritten(good, **{"outputs.y": (pa.field("outputs.y", pa.list_(pa.float32())),
                                          pa.array([[0.0] * 10, [None] * 10],
                                                   pa.list_(pa.float32())))}),
         "outputs.y: a null inside a tensor"),
        (rewritten(good, **{"outputs.y": (pa.field("outputs.y", pa.list_(pa.date32())),
                                          pa.array([[0] * 10, [1] * 10],
                                                   pa.list_(pa.int32())).cast(
                                              pa.list_(pa.date32())))}),
         "schema: column 'outputs.y': date32[day] values are no capture datatype"),
        (rewritten(good, ts=(pa.field("ts", pa.float64(), nullable=False),
                             pa.array([1764943200.0, 1764946800.0]))),
         "ts: a file holds the records of one hour"),
        (rewritten(good, **{"outputs.y.shape": (pa.field("outputs.y.shape",
                                                         pa.list_(pa.int32())),
                                                pa.array([[1, 10], None],
                                                         pa.list_(pa.int32())))}),
         "outputs.y: values and shape must be null in the same rows"),
    ]


def test_the_replica_api_checks_a_capture_file_footer_first_and_says_what_is_wrong():
    from registry.monitoring import capture_check

    limits = {"max_records": 20000, "max_decoded_bytes": 128 * 1024 * 1024}
    for bad, words in refused_files():
        with pytest.raises(capture_check.BadCapture) as refused:
            capture_check.check(bad, **limits)
        assert words in str(refused.value), (words, str(refused.value))
    checked = capture_check.check(good_file(n=3), **limits)
    assert (checked.model, checked.rows) == ("far", 3) and checked.first_ts < time.time()
    # every datatype a replica writes passes the check
    rng = np.random.default_rng(0)
    every = {name: rng.integers(0, 100, 6).astype(dt).reshape(2, 3) for name, dt in [
        ("f2", np.float16), ("f4", np.float32), ("f8", np.float64), ("b", np.bool_),
        ("i1", np.int8), ("i2", np.int16), ("i4", np.int32), ("i8", np.int64),
        ("u1", np.uint8), ("u2", np.uint16), ("u4", np.uint32), ("u8", np.uint64)]}
    every["s"] = np.array([b"a", "b"], dtype=object)
    every["scalar"] = np.array(1.5, np.float32)
    assert capture_check.check(good_file(**every), **limits).rows == 2


def services_replica_credential():
    from registry.services.replicas import credential_create

    return credential_create(name="capture-spec", actor=SYSTEM)


def test_a_replica_killed_with_9_loses_at_most_its_queue(engineer, ready_model, tmp_path):
    ready_model("kill", samples.mlp())
    services.endpoint_deploy(model_name="kill", version_number=1, actor=SYSTEM)
    assert put(engineer, "kill", percent=100).status_code == 200
    queue, batch = 50, 20
    with replicas(1, embedded=True, log_dir=tmp_path, MMC_CAPTURE_QUEUE_RECORDS=str(queue),
                  MMC_CAPTURE_BATCH_RECORDS=str(batch),
                  MMC_CAPTURE_FLUSH_SECONDS="0.2") as (rep,):
        wait_until(lambda: version_state(rep.name, "kill:1").get("state") == "READY",
                   timeout=60, what="kill:1 loaded")
        with httpx.Client(base_url=rep.url, timeout=30) as http:
            # the first record starts the encoder process (a fresh interpreter loading pyarrow:
            # seconds on a busy machine, while a burst would only fill the queue): one stored
            # first, then the burst whose loss the kill bounds
            assert http.post("/v2/models/kill/infer", json=ROW).status_code == 200
            sent = 1
            wait_until(lambda: recent("kill"), timeout=120, what="the first record stored")
            for _ in range(300):
                assert http.post("/v2/models/kill/infer", json=ROW).status_code == 200
                sent += 1
            metrics = http.get("/metrics").text
        encoders = encoder_processes(rep.proc.pid)
        assert encoders, "the replica's capture encoder process"
        rep.stop(sig_kill=True)
    # the encoder's input closes with the replica: it ends too, never left behind
    wait_until(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in encoders),
               timeout=30, what="the killed replica's capture encoder ended")
    dropped = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                  if line.startswith("mmc_capture_dropped_total{"))
    stored = len(recent("kill"))
    # sent one by one: all but what a full queue dropped (counted; the first flush also loads
    # pyarrow) and what was queued or being written is stored
    assert sent - dropped - stored <= queue + batch, (sent, dropped, stored)
    assert stored >= sent / 2, (sent, dropped, stored)


def test_retention_prunes_each_models_capture_older_than_its_endpoint_keeps(
        engineer, ready_model):
    ready_model("old", samples.mlp())
    ready_model("kept", samples.mlp())
    for name in ("old", "kept"):
        services.endpoint_deploy(model_name=name, version_number=1, actor=SYSTEM)
    assert put(engineer, "old", retention_days=2).status_code == 200
    assert put(engineer, "kept", retention_days=10).status_code == 200
    now = time.time()
    day = 86400
    for name in ("old", "kept"):
        capture_store.write_records(
            [{"id": f"{name}-{age}", "model": name, "version": 1, "role": "stable",
              "ts": now - age * day, "latency_ms": 1.0, "truncated": False}
             for age in (0, 1, 3, 5, 12)], writer="spec")
    prune_capture(now=now)

    def ids(name):
        return sorted(r["id"] for r in capture_store.iter_records(name, since=now - 20 * day,
                                                                  until=now))
    assert ids("old") == ["old-0", "old-1"]
    assert ids("kept") == ["kept-0", "kept-1", "kept-3", "kept-5"]


# -- console ----------------------------------------------------------------------------------

def _page(username: str):
    from django.contrib.auth.models import User
    from django.test import Client

    page = Client()
    page.force_login(User.objects.get(username=username))
    return page


def test_the_console_card_changes_capture_and_the_version_page_lists_and_replays(
        engineer, ready_model):
    ready_model("card", samples.mlp())
    ready_model("card", samples.mlp(seed=3))
    services.endpoint_deploy(model_name="card", version_number=1, actor=SYSTEM)
    page = _page("engineer")
    assert 'hx-get="/models/card/deployment/capture/"' in page.get(
        "/models/card/deployment/").content.decode()
    html = page.get("/models/card/deployment/capture/").content.decode()
    assert "off: nothing is recorded" in html and 'id="capture-form"' in html
    url = "/models/card/deployment/capture/"
    form = {"percent": "150", "mode": "both", "max_bytes": "4096", "retention_days": "7"}
    r = page.post(url, form, HTTP_HX_REQUEST="true")
    assert r.status_code == 400 and "percent must be a number from 0 to 100" in r.content.decode()
    assert float(Endpoint.objects.get(model__name="card").capture_percent) == 0
    r = page.post(url, {**form, "percent": "2.5"}, HTTP_HX_REQUEST="true")
    assert r.status_code == 200, r.content
    html = r.content.decode()
    assert "2.5 % of requests" in html and "7 days" in html, html
    assert _page("viewer").post(url, form).status_code == 403
    assert 'id="capture-form"' not in _page("viewer").get(url).content.decode()
    # captured requests of v1, newest first, and the replay page of one of them
    now = time.time()
    x = {"x": {"datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}}
    capture_store.write_records(
        [{"id": f"seen-{i}", "model": "card", "version": 1, "role": "stable", "ts": now - 60 + i,
          "latency_ms": 1.25, "truncated": False, "inputs": x,
          "outputs": {"y": {"datatype": "FP32", "shape": [1, 10], "data": [0.1] * 10}}}
         for i in range(3)], writer="spec")
    html = page.get("/models/card/versions/1/captured/").content.decode()
    assert html.index("seen-2") < html.index("seen-1") < html.index("seen-0")
    assert "/models/card/versions/1/captured/seen-2/replay/" in html
    html = page.get("/models/card/versions/1/captured/seen-2/replay/").content.decode()
    assert 'id="replay-form"' in html and '<option value="2" selected>v2</option>' in html
    assert '"inputs": [{"name": "x"' in html  # the body the page sends to v2
    assert page.get("/models/card/versions/1/captured/nope/replay/").status_code == 404


def test_capture_files_are_written_read_and_pruned_in_each_store(backend):
    """The same records through a folder and through S3 (the moto server): one Parquet file
    per model and hour beside a gzip JSON Lines file written before Parquet, both read back
    (as dicts, newest first, and as arrays for drift), found by request id, pruned per model."""
    import gzip

    import orjson

    from registry.monitoring.baselines import record_arrays
    from registry.store.artifacts import default_store

    now = time.time()
    records = [{"id": f"s-{age}", "model": m, "version": 1, "role": "stable",
                "ts": now - age * 3600, "latency_ms": 0.5, "truncated": False,
                "outputs": {"y": {"datatype": "FP32", "shape": [1, 2], "data": [0.25, 0.75]}}}
               for m in ("alpha", "beta") for age in (0, 30, 80)]
    keys = capture_store.write_records(records, writer="r1")
    assert len(keys) == 6 and all(k.startswith("capture/") and k.endswith(".parquet")
                                  for k in keys)
    old = {"id": "old-0", "model": "alpha", "version": 1, "role": "candidate",
           "ts": now - 2, "latency_ms": 0.7, "truncated": False,
           "inputs": {"x": {"datatype": "FP32", "shape": [1, 2], "data": [0.1, 0.2]}},
           "outputs": {"y": {"datatype": "FP32", "shape": [1, 2], "data": [0.5, 0.5]}}}
    legacy = f"{capture_store.partition('alpha', now - 2)}/{int((now - 2) * 1000)}-r0-1.jsonl.gz"
    default_store().put_object(legacy, gzip.compress(orjson.dumps(old) + b"\n"))
    got = list(capture_store.iter_records("alpha", since=now - 4 * 86400, newest_first=True))
    assert [r["id"] for r in got] == ["s-0", "old-0", "s-30", "s-80"]
    assert got[0]["outputs"]["y"]["data"] == [0.25, 0.75] and got[1] == old
    assert [r["id"] for r in capture_store.iter_records(
        "alpha", since=now - 3600, roles=["candidate"])] == ["old-0"]
    assert capture_store.find("beta", "s-30", since=now - 4 * 86400)["model"] == "beta"
    assert capture_store.find("alpha", "old-0", since=now - 600, version=1) == old
    assert capture_store.find("alpha", "old-0", since=now - 600, version=2) is None
    arrays, n = record_arrays(capture_store.iter_tensors("alpha", since=now - 3600, until=now,
                                                         version=1))
    assert n == 2 and arrays["outputs"]["y"].tolist() == [[0.5, 0.5], [0.25, 0.75]]
    assert arrays["inputs"]["x"].tolist() == [[np.float32(0.1), np.float32(0.2)]]
    removed = capture_store.prune(older_than_days=3, now=now, per_model={"alpha": 1})
    assert removed == 3  # alpha: 30 h and 80 h; beta: 80 h
    assert [r["id"] for r in capture_store.iter_records("alpha", since=now - 4 * 86400)] == [
        "old-0", "s-0"]
    assert sorted(r["id"] for r in capture_store.iter_records(
        "beta", since=now - 4 * 86400)) == ["s-0", "s-30"]
    # the hour's Parquet and JSON Lines files go together, as the rest of each model's
    assert capture_store.prune(older_than_days=0, now=now + 7200) == 4
    assert not list(capture_store.iter_records("alpha", since=now - 3600, until=now + 7200))
