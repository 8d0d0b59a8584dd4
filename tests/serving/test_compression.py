"""One bounded decompressor for request bodies: the HTTP app and decode_infer_request (which the
registry's async inference calls) both refuse to inflate past their limit."""

from __future__ import annotations

import gzip
import zlib

import orjson
import pytest

from serving.core.errors import InvalidInput, PayloadTooLarge
from serving.http.codec import decode_infer_request
from serving.http.compression import MAX_BODY_BYTES, decompress

DATA = b"x" * 10_000


def raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-15)
    return c.compress(data) + c.flush()


@pytest.mark.parametrize("encoding,body", [
    ("gzip", gzip.compress(DATA)),
    ("deflate", zlib.compress(DATA)),
    ("deflate", raw_deflate(DATA)),  # some clients send deflate without the zlib wrapper
    (" GZIP ", gzip.compress(DATA)),
    ("identity", DATA),
    ("", DATA),
])
def test_known_encodings_inflate_to_the_original_bytes(encoding, body):
    assert decompress(body, encoding, limit=len(DATA)) == DATA


def test_a_body_inflating_past_the_limit_is_payload_too_large():
    with pytest.raises(PayloadTooLarge, match="exceeds the limit of 9999 bytes") as info:
        decompress(gzip.compress(DATA), "gzip", limit=len(DATA) - 1)
    assert info.value.status == 413


@pytest.mark.parametrize("encoding,body,needle", [
    ("br", DATA, "unsupported Content-Encoding 'br'"),
    ("gzip", b"not gzip", "does not decompress"),
    ("gzip", gzip.compress(DATA)[:-20], "truncated"),
])
def test_unknown_or_broken_encodings_are_invalid_input(encoding, body, needle):
    with pytest.raises(InvalidInput, match=needle):
        decompress(body, encoding)


def test_decode_infer_request_is_bounded_by_max_bytes_defaulting_to_the_server_limit():
    request = orjson.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32",
                                        "data": [1.0]}]})
    body = gzip.compress(request)
    assert decode_infer_request(body, content_encoding="gzip").inputs[0].name == "x"
    with pytest.raises(PayloadTooLarge):
        decode_infer_request(body, content_encoding="gzip", max_bytes=len(request) - 1)
    bomb = gzip.compress(b" " * (MAX_BODY_BYTES + 1))
    with pytest.raises(PayloadTooLarge):
        decode_infer_request(bomb, content_encoding="gzip")
