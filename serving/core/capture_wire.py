"""How a sampled request travels from the request path to the capture encoder: packed into one
growing buffer as it is offered, unpacked into queue entries where the files are made.

Packing on the request path costs a couple of microseconds spread over every sampled request,
and leaves nothing behind that the garbage collector tracks or that must be freed one object
at a time: the flusher hands a whole buffer to the encoder process (serving.core.
capture_encoder) and the serving process's interpreter never walks the records. Before, the
queue held references to each request's arrays and a thread of the serving process turned a
batch into columns with the GIL held (~2 us per record, in stretches that stalled the event
loop: p99 x2.8 at 100 % sampling, bench/results/capture-2026-12-07.md).

One record, little-endian: what varies per request first, then its layout (route names and
tensor headers, the same bytes for every request of the usual kind: the encoder parses each
layout once), then the tensors' data:

    u32 length of the whole record   f64 ts   f64 latency ms   u8 flags   u16 tensors
    u16 id length (0xFFFF: none)     u32 layout length         the id (UTF-8)
    layout: model, version, role     each u16 length + UTF-8
            per tensor: u8 part (0 inputs, 1 outputs), u16 + UTF-8 name, u8 + ASCII numpy
            dtype (".T" for text), u8 ndim, ndim x i64 dims, u64 data bytes
    data:   each tensor's bytes in the layout's order (text: u32 length + UTF-8 per element)

flags: 1 truncated (a tensor past the byte cap was left out), 2 has inputs, 4 has outputs,
8 a batch: the requests one dynamic-batcher run answered, all sampled, packed as one record
(serving.core.batching: the loop packs a batch's joined arrays once instead of each request's
own). In a batch record the id length counts the requests, the latency is 0, and what follows
the fixed part is, per request, f64 latency ms, u32 rows, u16 id length (0xFFFF: none), then
the ids, then the layout; each tensor's first dimension is the requests' rows together, in
order. It unpacks into one entry per request, the same as had each been offered alone.

The encoder reads a regular buffer (one model and hour, the same numeric tensors in every record:
the usual one) as columns (`columns`): one walk over the records' fixed parts, then the
requests' tables, ids and each tensor's data joined and read once for the whole buffer, no
Python object per request. Any other buffer is unpacked record by record (`unpack_blocks`,
`entries`), which also says what is wrong with bytes that are not records.
"""

from __future__ import annotations

import itertools
import os
import struct
from typing import NamedTuple

import numpy as np

from serving.core import capture_files

RECORD = struct.Struct("<IddBHHI")
U16 = struct.Struct("<H")
U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")
BATCH_ENTRY = struct.Struct("<dIH")  # a batch record's request, packed one by one
#: the same layout read as a table, a batch record's requests at once
BATCH_TABLE = np.dtype([("latency", "<f8"), ("rows", "<u4"), ("id", "<u2")])
if BATCH_TABLE.itemsize != BATCH_ENTRY.size:
    raise ImportError("capture_wire: BATCH_TABLE and BATCH_ENTRY disagree")
TRUNCATED, HAS_INPUTS, HAS_OUTPUTS, BATCH = 1, 2, 4, 8
_PARTS_SEEN = HAS_INPUTS | HAS_OUTPUTS
NO_ID = 0xFFFF
TEXT = b".T"
_PARTS = (b"\x00", b"\x01")


class Uncapturable(ValueError):
    """A tensor the capture format cannot hold (complex, datetime, a non-string name...)."""


def text(s: str) -> bytes:
    raw = s.encode("utf-8", "surrogatepass")
    if len(raw) >= NO_ID:
        raise Uncapturable(f"a name or id of {len(raw)} bytes")
    return U16.pack(len(raw)) + raw


class Packer:
    """Packs tensors and route names; keeps what repeats (a route's names, a tensor's header
    by part, name, dtype, shape and strides), so the capture queue packs a request of the usual
    kind with look-ups alone (`headers`, `routes`)."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str, str], bytes] = {}
        self.headers: dict[tuple, bytes] = {}

    def route(self, model: str, version: str, role: str) -> bytes:
        key = (model, version, role)
        seg = self.routes.get(key)
        if seg is None:
            if len(self.routes) > 4096:
                self.routes.clear()
            seg = self.routes[key] = text(model) + text(version) + text(role)
        return seg

    def tensor(self, part: int, name, array) -> tuple[bytes, bytes, int]:
        """(header, data, size against the byte cap) of one tensor; raises Uncapturable. A
        numeric C-ordered array's header is kept for the next one like it."""
        if type(array) is not np.ndarray:
            array = np.asarray(array)
        if type(name) is not str:
            raise Uncapturable(f"tensor name {name!r} is not a string")
        try:
            textual = capture_files.kind_of(array) is capture_files.TEXT_DTYPE
        except TypeError as exc:
            raise Uncapturable(str(exc)) from None
        dims = b"".join(struct.pack("<q", d) for d in array.shape)
        head = _PARTS[part] + text(name)
        if textual:
            data = b"".join(U32.pack(len(b)) + b for b in (
                capture_files.as_text(x).encode("utf-8", "surrogatepass")
                for x in array.ravel().tolist()))
            return (head + bytes([len(TEXT)]) + TEXT + bytes([array.ndim]) + dims
                    + U64.pack(len(data))), data, capture_files.text_bytes(array)
        dtype = array.dtype
        code = dtype.str.encode("ascii")
        header = head + bytes([len(code)]) + code + bytes([array.ndim]) + dims \
            + U64.pack(array.nbytes)
        if array.flags.c_contiguous:  # the queue's look-up finds it next time
            if len(self.headers) > 4096:
                self.headers.clear()
            self.headers[(part, name, dtype, array.shape, array.strides)] = header
        return header, array.tobytes(), array.nbytes


def unpack(blob) -> list[tuple]:
    """A buffer of records as queue entries (serving.core.capture_files), one per request,
    arrays viewing `blob` (read-only); ValueError where the bytes are not records."""
    return entries(unpack_blocks(blob))


def unpack_blocks(blob) -> list[tuple]:
    """A buffer of records as blocks, one per record, arrays viewing `blob` (read-only);
    ValueError where the bytes are not records. A block: (ts, ([request id or None],
    [latency ms], [rows] or None for a request alone), model, version, role, inputs or None,
    outputs or None, truncated, kinds: (has inputs, has outputs, (part, tensor name, dtype or
    None for text)...)); a batcher run's tensors joined along axis 0."""
    try:
        return _unpack(memoryview(blob))
    except (struct.error, IndexError, TypeError, UnicodeDecodeError) as exc:
        raise ValueError(f"capture record cut short or malformed: {exc}") from None


def entries(blocks: list[tuple]) -> list[tuple]:
    """Blocks as queue entries, one per request (a run's requests each with their own rows)."""
    out = []
    for ts, (ids, latencies, counts), model, version, role, inputs, outputs, truncated, _ \
            in blocks:
        if counts is None:  # a request alone
            out.append((ts, ids[0], model, version, role, latencies[0], inputs, outputs, 2**62,
                        truncated, 0))
            continue
        start = 0
        for request_id, latency, rows in zip(ids, latencies, counts, strict=True):
            end = start + rows
            ins = None if inputs is None else {n: a[start:end] for n, a in inputs.items()}
            outs = None if outputs is None else {n: a[start:end] for n, a in outputs.items()}
            start = end
            out.append((ts, request_id, model, version, role, latency, ins, outs, 2**62,
                        truncated, 0))
    return out


def _unpack(view: memoryview) -> list[tuple]:
    layouts: dict[tuple[bytes, int], tuple] = {}
    blocks = []
    at, end = 0, len(view)
    fixed = RECORD.size
    while at < end:
        length, ts, latency, flags, count, id_size, layout_size = RECORD.unpack_from(view, at)
        pos = at + fixed
        if flags & BATCH:
            requests, pos = _requests(view, pos, id_size)
        elif id_size == NO_ID:
            requests = ([None], [latency], None)
        else:
            requests = ([str(view[pos:pos + id_size], "utf-8", "surrogatepass")], [latency], None)
            pos += id_size
        key = bytes(view[pos:pos + layout_size])
        kinds = layouts.get((key, flags & _PARTS_SEEN))
        if kinds is None:
            layout = _layout(key, count)
            kinds = layouts[(key, flags & _PARTS_SEEN)] = (layout, (
                bool(flags & HAS_INPUTS), bool(flags & HAS_OUTPUTS),
                *((capture_files.PARTS[t[0]], t[1], t[2]) for t in layout[3])))
        layout, kinds = kinds
        pos += layout_size
        model, version, role, tensors = layout
        parts: tuple[dict | None, dict | None] = (
            {} if flags & HAS_INPUTS else None, {} if flags & HAS_OUTPUTS else None)
        for part, name, dtype, dims, size in tensors:
            data = view[pos:pos + size]
            pos += size
            if dtype is None:
                array = np.array(_elements(data), dtype=object).reshape(dims)
            else:
                array = np.frombuffer(data, dtype).reshape(dims)
            parts[part][name] = array  # type: ignore[index]
        if pos != at + length:
            raise ValueError(f"capture record at {at}: {pos - at} bytes read of {length}")
        if flags & BATCH:
            total = sum(requests[2])
            for tensors_of in parts:
                if any(a.ndim == 0 or a.shape[0] != total for a in (tensors_of or {}).values()):
                    raise ValueError(f"capture record at {at}: a batch's tensor without its rows")
        blocks.append((ts, requests, model, version, role, parts[0], parts[1],
                       bool(flags & TRUNCATED), kinds))
        at += length
    return blocks


class Columns(NamedTuple):
    """A regular buffer's requests as columns (`columns`), one value or row per request in
    order: what serving.core.capture_files.encode_columns writes without a Python object per
    request. `ids`: (ASCII bytes of every id, i32 offsets) where all requests have an ASCII id,
    else a list of str or None. `tensors`: per (part, name, dtype) of `kinds`, (values, i64
    values per request, i32 shape per request as an n x ndim matrix)."""

    model: str
    first_ts: float
    kinds: tuple  # (has inputs, has outputs, (part, tensor name, dtype)...), as a block's
    ids: tuple | list
    versions: np.ndarray  # str objects
    roles: np.ndarray
    ts: np.ndarray
    latency: np.ndarray
    truncated: np.ndarray
    tensors: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
    counts: dict[str, int]  # requests per version


_ID_SIZES: dict[int, struct.Struct] = {}  # requests in a batch record -> its table's id sizes


def columns(blob) -> Columns | None:
    """A packed buffer as columns when it is regular: one model, one hour, every record with the
    same parts and tensors (names, numeric dtypes in native byte order, ranks of 1 or more) and
    nothing the general way would refuse; None otherwise (and for bytes that are not records):
    the caller unpacks the general way (`unpack_blocks`), which says what is wrong. The walk
    reads each record's fixed part and keeps where its pieces are; the requests' table, ids and
    each tensor's values are then joined and read once for the whole buffer."""
    try:
        return _columns(memoryview(blob))
    except (struct.error, IndexError, TypeError, ValueError, UnicodeDecodeError):
        return None


def _columns(view: memoryview) -> Columns | None:  # noqa: C901 - one pass, kept together
    fixed = RECORD.size
    layouts: dict[tuple[bytes, int], int] = {}
    parsed: list[tuple] = []
    rec_ts: list[float] = []
    rec_n: list[int] = []
    rec_layout: list[int] = []
    rec_cut: list[bool] = []
    rec_data: list[int] = []
    tables: list = []
    ids: list = []
    parts = None
    at, end = 0, len(view)
    while at < end:
        length, ts, latency, flags, count, id_size, layout_size = RECORD.unpack_from(view, at)
        pos = at + fixed
        if flags & BATCH:
            n = id_size
            sizes_of = _ID_SIZES.get(n)
            if sizes_of is None:
                if n < 1:
                    return None
                sizes_of = _ID_SIZES[n] = struct.Struct("<" + "12xH" * n)
            sizes = sizes_of.unpack_from(view, pos)
            table_end = pos + BATCH_ENTRY.size * n
            tables.append(view[pos:table_end])
            id_len = sum(sizes) if NO_ID not in sizes else sum(x for x in sizes if x != NO_ID)
            pos = table_end
        else:
            n = 1
            tables.append(BATCH_ENTRY.pack(latency, 0, id_size))
            id_len = 0 if id_size == NO_ID else id_size
        ids.append(view[pos:pos + id_len])
        pos += id_len
        key = (view[pos:pos + layout_size].tobytes(), flags & BATCH)
        index = layouts.get(key)
        if index is None:
            if len(key[0]) != layout_size:
                return None
            model, version, role, tensors = _layout(key[0], count)
            index = layouts[key] = len(parsed)
            starts = list(itertools.accumulate((t[4] for t in tensors), initial=0))
            parsed.append((model, version, role, tensors, starts[-1], bool(flags & BATCH),
                           starts))
        if parts is None:
            parts = flags & _PARTS_SEEN
        pos += layout_size
        if flags & _PARTS_SEEN != parts or pos + parsed[index][4] != at + length:
            return None
        rec_data.append(pos)
        rec_ts.append(ts)
        rec_n.append(n)
        rec_layout.append(index)
        rec_cut.append(bool(flags & TRUNCATED))
        at += length
    if not rec_n or at != end:
        return None
    model, signature = parsed[0][0], [(t[0], t[1], t[2], len(t[3])) for t in parsed[0][3]]
    for layout in parsed:
        if layout[0] != model or [(t[0], t[1], t[2], len(t[3])) for t in layout[3]] != signature:
            return None
    for _, _, dtype, ndim in signature:
        if dtype is None or dtype.kind not in "biuf" or not dtype.isnative or ndim < 1:
            return None
    if int(min(rec_ts) // 3600) != int(max(rec_ts) // 3600):
        return None

    counts = np.array(rec_n, np.int64)
    total = int(counts.sum())
    table = np.frombuffer(b"".join(tables), BATCH_TABLE)
    if len(table) != total:
        return None
    layout_of = np.array(rec_layout, np.int64)
    batched = np.array([layout[5] for layout in parsed], np.bool_)[layout_of]  # per record
    of_request = np.repeat(layout_of, counts)  # each request's layout
    batch = np.repeat(batched, counts)
    rows = table["rows"].astype(np.int64)
    joined = np.add.reduceat(rows, np.cumsum(counts) - counts)  # a batch record's rows
    sizes = table["id"]
    missing = sizes == NO_ID
    raw = b"".join(ids)
    if not missing.any() and raw.isascii():
        offsets = np.zeros(total + 1, np.int32)
        np.cumsum(sizes, out=offsets[1:])
        if offsets[-1] != len(raw):
            return None
        given: tuple | list = (raw, offsets)
    else:
        given = _ids(raw, sizes.tolist())
    columns = []
    for j, (_, _, dtype, _) in enumerate(signature):
        dims = np.array([layout[3][j][3] for layout in parsed], np.int64)  # layouts x ndim
        span = [(layout[6][j], layout[6][j + 1]) for layout in parsed]  # its bytes, per layout
        values = b"".join([view[at + span[i][0]:at + span[i][1]]
                           for at, i in zip(rec_data, rec_layout, strict=True)])
        if (batched & (dims[layout_of, 0] != joined)).any():
            return None  # a batch's tensor without its requests' rows
        shapes = dims[of_request]  # a request alone: its dims; a batch's: its rows, the rest
        shapes[batch, 0] = rows[batch]
        per = shapes.prod(axis=1)
        if int(per.sum()) * dtype.itemsize != len(values):
            return None
        columns.append((np.frombuffer(values, dtype), per, shapes.astype(np.int32)))
    names = np.array([(layout[1], layout[2]) for layout in parsed], dtype=object)
    counted = np.bincount(layout_of, weights=counts, minlength=len(parsed))
    per_version: dict[str, int] = {}
    for layout, n in zip(parsed, counted.tolist(), strict=True):
        per_version[layout[1]] = per_version.get(layout[1], 0) + int(n)
    return Columns(model, min(rec_ts), (
        bool(parts & HAS_INPUTS), bool(parts & HAS_OUTPUTS),
        *((capture_files.PARTS[p], name, dtype) for p, name, dtype, _ in signature)),
        given, names[of_request, 0], names[of_request, 1],
        np.repeat(np.array(rec_ts, np.float64), counts), table["latency"].astype(np.float64),
        np.repeat(np.array(rec_cut, np.bool_), counts), columns, per_version)


def _requests(view: memoryview, pos: int, n: int) -> tuple[tuple, int]:
    """A batch record's requests, ([id or None], [latency ms], [rows]), and where its layout
    begins: the table read in one go, the ids decoded in one go where they are ASCII."""
    table = np.frombuffer(view, BATCH_TABLE, count=n, offset=pos)
    pos += BATCH_TABLE.itemsize * n
    sizes = table["id"].tolist()
    lengths = [0 if size == NO_ID else size for size in sizes]
    end = pos + sum(lengths)
    raw = bytes(view[pos:end])
    if len(raw) != end - pos:
        raise ValueError("capture record cut short in its ids")
    return (_ids(raw, sizes), table["latency"].tolist(), table["rows"].tolist()), end


def _ids(raw: bytes, sizes: list[int]) -> list[str | None]:
    """Requests' ids from their bytes one after another and each one's size (NO_ID: none);
    ValueError where the sizes do not add up to the bytes."""
    ids: list[str | None] = []
    at = 0
    if raw.isascii():  # a character per byte: the ids are slices of one string
        text = raw.decode("ascii")
        for size in sizes:
            if size == NO_ID:
                ids.append(None)
            else:
                ids.append(text[at:at + size])
                at += size
    else:
        for size in sizes:
            if size == NO_ID:
                ids.append(None)
            else:
                ids.append(str(raw[at:at + size], "utf-8", "surrogatepass"))
                at += size
    if at != len(raw):
        raise ValueError(f"capture record ids: {at} bytes read of {len(raw)}")
    return ids


def _layout(raw: bytes, count: int) -> tuple:
    """(model, version, role, [(part, name, dtype or None for text, dims, data bytes)])."""
    pos, names = 0, []
    for _ in range(3):
        (n,) = U16.unpack_from(raw, pos)
        names.append(raw[pos + 2:pos + 2 + n].decode("utf-8", "surrogatepass"))
        pos += 2 + n
    tensors = []
    for _ in range(count):
        part = raw[pos]
        (n,) = U16.unpack_from(raw, pos + 1)
        name = raw[pos + 3:pos + 3 + n].decode("utf-8", "surrogatepass")
        pos += 3 + n
        k = raw[pos]
        code = raw[pos + 1:pos + 1 + k]
        ndim = raw[pos + 1 + k]
        pos += 2 + k
        dims = struct.unpack_from(f"<{ndim}q", raw, pos)
        pos += 8 * ndim
        (size,) = U64.unpack_from(raw, pos)
        pos += 8
        tensors.append((part, name, None if code == TEXT else np.dtype(code.decode("ascii")),
                        dims, size))
    if pos != len(raw):
        raise ValueError(f"capture record layout: {pos} bytes read of {len(raw)}")
    return names[0], names[1], names[2], tensors


def _elements(data: memoryview) -> list[str]:
    out, pos = [], 0
    while pos < len(data):
        (n,) = U32.unpack_from(data, pos)
        out.append(str(data[pos + 4:pos + 4 + n], "utf-8", "surrogatepass"))
        pos += 4 + n
    return out


#: Request ids this process gives (a request that came without one, a record without one): a
#: random prefix per process and a counter (cheaper than a uuid per request, unique across
#: replicas and encoder processes all the same).
_ID_PREFIX = os.urandom(6).hex()
_ID_COUNT = itertools.count(1)


def new_request_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_COUNT):012x}"


