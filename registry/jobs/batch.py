"""Batch transform: a dataset split into chunks of rows, each chunk run in batches and written to
its own part file (atomic rename), then the parts assembled, streaming, into the output.

The part files are the checkpoint: a worker resuming after kill -9 skips every chunk whose part
exists and redoes only the chunk that was in flight, whose half-written temp file never became a
part. Assembly only reads parts, so running it twice gives the same file.
Outputs keep the input's row order: .npy in → .npy out (one output) or .npz (one array per
output); .npz in → .npz out; JSON Lines in → JSON Lines out, one line per input line.
"""

from __future__ import annotations

import os
import shutil
import time
import zipfile
from pathlib import Path

import numpy as np
import orjson

from registry.errors import InvalidRequest
from registry.jobs.lease import JobFailed, Lease, LeaseLost, chunk_count, predict_rows, session_for
from registry.models import Job
from registry.store.files import (
    ArraySource,
    atomic_write,
    dataset_path,
    index_lines,
    job_dir,
    read_lines,
)
from serving.core.dtypes import DATATYPES
from serving.core.errors import InvalidInput
from serving.core.tensor_signature import validate_inputs
from serving.core.tensors import InputTensor, RequestedOutput
from serving.http.codec import decode_infer_request, encode_infer_response

PROGRESS_EVERY_S = 0.5


def match_columns(columns: dict, signature: dict) -> dict[str, str]:
    """Map each model input to a dataset array, checking dtype (same-kind casts allowed) and the
    row shape against the signature. Raises InvalidRequest naming what does not fit."""
    inputs = signature.get("inputs") or []
    if "" in columns:  # a bare .npy
        if len(inputs) != 1:
            raise InvalidRequest(f"the model takes {len(inputs)} inputs "
                                 f"({', '.join(i['name'] for i in inputs)}); upload an .npz "
                                 f"with one array per input name", field="dataset")
        mapping = {inputs[0]["name"]: ""}
    else:
        missing = [i["name"] for i in inputs if i["name"] not in columns]
        if missing:
            raise InvalidRequest(f"the dataset has no array for input(s) {', '.join(missing)} "
                                 f"(it has {', '.join(columns)})", field="dataset")
        mapping = {i["name"]: i["name"] for i in inputs}
    for spec in inputs:
        col = columns[mapping[spec["name"]]]
        if spec["datatype"] == "BYTES":
            raise InvalidRequest(f"input {spec['name']} is BYTES; use a JSON Lines dataset",
                                 field="dataset")
        want, got = DATATYPES[spec["datatype"]], np.dtype(col["dtype"])
        if got != want and not np.can_cast(got, want, "same_kind"):
            raise InvalidRequest(f"input {spec['name']}: dataset dtype {got} cannot be cast to "
                                 f"the model's {spec['datatype']}", field="dataset")
        expected = (spec.get("shape") or [-1])[1:]
        row = col["shape"]
        if len(row) != len(expected) or any(w not in (-1, g) for g, w in zip(row, expected,
                                                                              strict=False)):
            raise InvalidRequest(f"input {spec['name']}: dataset rows have shape {row} but the "
                                 f"model expects {expected} per row", field="dataset")
    return mapping


def parts_dir(job: Job) -> Path:
    return job_dir(job.pk) / "parts"


def run_batch(job: Job, lease: Lease) -> dict:
    version, dataset, params = job.version, job.dataset, job.params
    path = dataset_path(dataset)
    if not path.exists():
        raise JobFailed("the dataset file is missing")
    chunk_rows, batch_size = params["chunk_rows"], params["batch_size"]
    runtime = session_for(version)
    if dataset.format == "jsonl":
        rows, offsets = index_lines(path, chunk_rows)
        source = _JsonLines(path, offsets, version, batch_size, chunk_rows)
        ext = "jsonl"
    else:
        rows = dataset.rows
        source = _Arrays(path, dataset.format, match_columns(dataset.columns, version.signature),
                         version.signature, batch_size)
        ext = "npz"
    if rows == 0:
        raise JobFailed("the dataset has no rows")
    n = chunk_count(rows, chunk_rows)
    parts = parts_dir(job)
    parts.mkdir(parents=True, exist_ok=True)
    part = [parts / f"part-{i:06d}.{ext}" for i in range(n)]
    rows_of = [min(chunk_rows, rows - i * chunk_rows) for i in range(n)]
    done = [i for i in range(n) if part[i].exists()]
    if done:  # a resume: parts are written without fsync, so check each before trusting it
        for i in done[:]:
            if not _part_ok(part[i], rows_of[i]):
                part[i].unlink()
                done.remove(i)
    rows_done = sum(rows_of[i] for i in done)
    lease.update(rows_total=rows, chunks_total=n, chunks_done=len(done), rows_done=rows_done,
                 chunks_resumed=len(done))
    limit = float(params.get("max_rows_per_second") or 0)
    started, ran, last_report = time.perf_counter(), 0, 0.0
    try:
        for i in range(n):
            if part[i].exists():
                continue
            if lease.lost:
                raise LeaseLost()
            start = i * chunk_rows
            source.write_chunk(runtime, start, start + rows_of[i], part[i], lease)
            ran += rows_of[i]
            rows_done += rows_of[i]
            done.append(i)
            now = time.perf_counter()
            if limit:  # throttle so a batch leaves the machine to real-time serving
                pause = ran / limit - (now - started)
                if pause > 0:
                    time.sleep(pause)
                    now = time.perf_counter()
            if now - last_report >= PROGRESS_EVERY_S or len(done) == n:
                lease.update(rows_done=rows_done, chunks_done=len(done),
                             rows_per_second=ran / max(now - started, 1e-9))
                last_report = now
    finally:
        source.close()
    result = job_dir(job.pk) / f"result.{params['output_format']}"
    if dataset.format == "jsonl":
        _concat(part, result)
    else:
        _assemble(part, rows, result, params["output_format"])
    return {"result_name": result.name, "result_bytes": result.stat().st_size,
            "rows_done": rows, "result_headers": {"Content-Type": "application/octet-stream"}}


class _Arrays:
    def __init__(self, path: Path, fmt: str, mapping: dict[str, str], signature: dict,
                 batch_size: int):
        self.source = ArraySource(path, fmt)
        self.mapping = mapping
        self.dtypes = {s["name"]: DATATYPES[s["datatype"]] for s in signature["inputs"]}
        self.batch_size = batch_size

    def write_chunk(self, runtime, start: int, stop: int, dest: Path, lease: Lease) -> None:
        feeds = {}
        for name, col in self.mapping.items():
            array = self.source.read(col, start, stop)
            if array.dtype != self.dtypes[name]:
                array = array.astype(self.dtypes[name])
            feeds[name] = array
        out = predict_rows(runtime, feeds, stop - start, self.batch_size, None, lease)
        bad = [k for k, v in out.items() if v.ndim == 0 or v.shape[0] != stop - start]
        if bad:
            raise JobFailed(f"output(s) {', '.join(bad)} have no row per input row; batch "
                            f"transform needs outputs batched like the inputs")
        atomic_write(dest, lambda f: np.savez(f, **out), durable=False)

    def close(self) -> None:
        self.source.close()


def _part_ok(path: Path, rows: int) -> bool:
    """Whether a part file from an earlier attempt is whole: `rows` rows in every output."""
    try:
        if path.suffix == ".jsonl":
            data = path.read_bytes()
            return data.endswith(b"\n") and data.count(b"\n") == rows
        with np.load(path) as z:
            return bool(z.files) and all(z[k].shape[:1] == (rows,) for k in z.files)
    except Exception:  # truncated or garbage after a machine crash
        return False


def _assemble(parts: list[Path], rows: int, result: Path, output_format: str) -> None:
    """Append the parts, in order, to one .npy per output: sequential writes after the header,
    one part in memory at a time."""
    with np.load(parts[0]) as first:
        layout = {k: (first[k].dtype, first[k].shape[1:]) for k in first.files}
    if output_format == "npy" and len(layout) != 1:
        raise JobFailed(f"the model has {len(layout)} outputs; choose output_format npz")
    tmp = result.parent / ".assemble"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    files = {}
    for name, (dtype, row_shape) in layout.items():
        files[name] = tmp / f"{name}.npy"
        with open(files[name], "wb") as f:
            np.lib.format.write_array_header_2_0(f, {
                "descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                "shape": (rows, *row_shape)})
            at = 0
            for p in parts:
                with np.load(p) as z:
                    chunk = z[name]
                if chunk.dtype != dtype or chunk.shape[1:] != row_shape:
                    raise JobFailed(f"part {p.name}: output {name} is {chunk.dtype} "
                                    f"{chunk.shape[1:]}, expected {dtype} {row_shape}")
                f.write(np.ascontiguousarray(chunk).data)
                at += len(chunk)
            f.flush()
            os.fsync(f.fileno())
        if at != rows:
            raise JobFailed(f"assembled {at} rows of {name}, expected {rows}")
    if output_format == "npy":
        os.replace(next(iter(files.values())), result)
    else:
        def write(f):
            with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
                for name, p in files.items():
                    zf.write(p, arcname=f"{name}.npy")
        atomic_write(result, write)
    shutil.rmtree(tmp, ignore_errors=True)


def _concat(parts: list[Path], result: Path) -> None:
    def write(f):
        for p in parts:
            with open(p, "rb") as src:
                shutil.copyfileobj(src, f, 1024 * 1024)
    atomic_write(result, write)


class _JsonLines:
    """Each record is one line: either `{"<input>": <row values>, ...}` (answered as
    `{"<output>": <row values>}`), or a v2 infer request (answered with its v2 response)."""

    def __init__(self, path: Path, offsets: list[int], version, batch_size: int,
                 chunk_rows: int):
        self.path, self.offsets, self.version = path, offsets, version
        self.signature = version.signature
        self.batch_size, self.chunk_rows = batch_size, chunk_rows

    def _parse(self, line: bytes, number: int):
        try:
            doc = orjson.loads(line)
            if not isinstance(doc, dict):
                raise InvalidInput("a record must be a JSON object")
            if "inputs" in doc:
                request = decode_infer_request(line)
                tensors = request.inputs
            else:
                request, tensors = None, []
                for spec in self.signature["inputs"]:
                    if spec["name"] not in doc:
                        raise InvalidInput(f"missing input '{spec['name']}'")
                    dtype = DATATYPES[spec["datatype"]]
                    value = doc[spec["name"]]
                    if spec["datatype"] == "BYTES":
                        array = np.array([v.encode() if isinstance(v, str) else v
                                          for v in np.ravel(value)], dtype=object)
                        array = array.reshape(np.shape(value))
                    else:
                        array = np.asarray(value, dtype=dtype)
                    tensors.append(InputTensor(spec["name"], spec["datatype"],
                                               [1, *array.shape], {}, array[None]))
            feeds = validate_inputs(tensors, self.signature, 1 << 62)
        except (InvalidInput, orjson.JSONDecodeError, ValueError, TypeError) as exc:
            raise JobFailed(f"record {number}: {getattr(exc, 'message', exc)}") from None
        return request, feeds

    def write_chunk(self, runtime, start: int, stop: int, dest: Path, lease: Lease) -> None:
        offset = self.offsets[start // self.chunk_rows]
        records = [self._parse(line, start + j + 1)
                   for j, line in enumerate(read_lines(self.path, offset, stop - start))]
        lines: list[bytes] = []
        group: list = []
        group_rows = 0

        def flush() -> None:
            nonlocal group, group_rows
            if not group:
                return
            names = list(group[0][1])
            feeds = {k: np.concatenate([g[1][k] for g in group]) for k in names}
            out = predict_rows(runtime, feeds, group_rows, self.batch_size, None, lease)
            at = 0
            for request, f in group:
                n = next(iter(f.values())).shape[0]
                piece = {k: v[at:at + n] for k, v in out.items()}
                at += n
                if request is None:
                    lines.append(orjson.dumps({k: v[0] for k, v in piece.items()},
                                              option=orjson.OPT_SERIALIZE_NUMPY))
                else:
                    requested = ([RequestedOutput(o.name, False, o.parameters)
                                  for o in request.outputs] if request.outputs else None)
                    body, _ = encode_infer_response(
                        model_name=self.version.model.name,
                        model_version=str(self.version.number), request_id=request.id,
                        outputs=piece, requested=requested, binary_output=False)
                    lines.append(body)
            group, group_rows = [], 0

        for request, feeds in records:
            rows = next(iter(feeds.values())).shape[0]
            if group and (group_rows + rows > self.batch_size or any(
                    v.shape[1:] != group[0][1][k].shape[1:] for k, v in feeds.items())):
                flush()
            group.append((request, feeds))
            group_rows += rows
        flush()
        if len(lines) != stop - start:
            raise JobFailed(f"chunk at record {start + 1}: read {len(lines)} records, expected "
                            f"{stop - start}")
        atomic_write(dest, lambda f: f.write(b"\n".join(lines) + b"\n"), durable=False)

    def close(self) -> None:
        pass
