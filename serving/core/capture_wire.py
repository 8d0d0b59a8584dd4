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
"""

from __future__ import annotations

import itertools
import os
import struct

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
    """A buffer of records as blocks (serving.core.capture_files.encode_blocks: a request, or
    a batcher run's requests with their tensors joined), arrays viewing `blob` (read-only);
    ValueError where the bytes are not records."""
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
    ids: list[str | None] = []
    if raw.isascii():  # a character per byte: the ids are slices of one string
        text, at = raw.decode("ascii"), 0
        for size, length in zip(sizes, lengths, strict=True):
            ids.append(None if size == NO_ID else text[at:at + length])
            at += length
    else:
        at = 0
        for size, length in zip(sizes, lengths, strict=True):
            ids.append(None if size == NO_ID else str(raw[at:at + length], "utf-8",
                                                         "surrogatepass"))
            at += length
    return (ids, table["latency"].tolist(), table["rows"].tolist()), end


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


