"""Content-Encoding of request bodies (gzip, deflate), inflated with a bound: a small compressed
body can never become an unbounded one in memory. Pure bytes in, bytes out; no HTTP here."""

from __future__ import annotations

import zlib

from serving.core.errors import InvalidInput, PayloadTooLarge

#: The default bound on a request body, compressed or not (ServingSettings.max_body_bytes).
MAX_BODY_BYTES = 64 * 1024 * 1024


def decompress(body: bytes, encoding: str, *, limit: int = MAX_BODY_BYTES) -> bytes:
    """`body` decoded per its Content-Encoding, refusing to inflate past `limit` bytes.

    PayloadTooLarge (413) when it would; InvalidInput (400) for an unknown encoding or a body
    that does not decompress.
    """
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        attempts = (31,)
    elif encoding == "deflate":  # HTTP deflate is zlib-wrapped; some clients send it raw
        attempts = (15, -15)
    else:
        raise InvalidInput(f"unsupported Content-Encoding {encoding!r} (use gzip or deflate)")
    error: Exception | None = None
    for wbits in attempts:
        inflater = zlib.decompressobj(wbits)
        try:
            out = inflater.decompress(body, limit + 1)
        except zlib.error as exc:
            error = exc
            continue
        if len(out) > limit or inflater.unconsumed_tail:
            raise PayloadTooLarge(f"decompressed request body exceeds the limit of {limit} bytes")
        if not inflater.eof:
            raise InvalidInput(f"Content-Encoding {encoding}: body is truncated")
        return out
    raise InvalidInput(f"Content-Encoding {encoding}: body does not decompress ({error})")
