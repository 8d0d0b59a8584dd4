"""What a client reads from the serving protocol: every answer whole and in order, whether it
leaves as one send (head and body together) or as several (a streamed body, a lone write); and
what the app reads: a body whole however many reads it arrived in."""

from __future__ import annotations

import asyncio
import socket
import time

import numpy as np
import orjson
import pytest
from onnx import TensorProto

from registry import samples
from serving.http.protocol import _Chunks, _CoalescingTransport
from tests.serving.test_app import Server, write_model

REQUEST = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32",
                                    "data": [0.25] * 64}]})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("writes") / "models"
    write_model(root, "mlp", "1", samples.mlp(), {"max_batch_size": 8})
    write_model(root, "wide", "1", samples.identity(TensorProto.FLOAT, ["batch", "n"]))
    srv = Server(root)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def infer(request_id: str) -> bytes:
    body = orjson.dumps({**orjson.loads(REQUEST), "id": request_id})
    return (b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
            b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body)) + body


def read_answers(sock: socket.socket, count: int) -> list[tuple[bytes, dict]]:
    """`count` HTTP answers read off one connection: status line and JSON body each."""
    buf, answers = b"", []
    while len(answers) < count:
        head, sep, rest = buf.partition(b"\r\n\r\n")
        if sep:
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            if len(rest) >= length:
                answers.append((head.split(b"\r\n")[0], orjson.loads(rest[:length])))
                buf = rest[length:]
                continue
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {len(answers)} of {count} answers"
        buf += chunk
    return answers


def test_a_large_body_sent_in_pieces_reaches_the_model_whole(server):
    x = np.random.default_rng(3).standard_normal((1, 300_000)).astype(np.float32)  # 1.2 MB
    head = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 300_000], "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "outputs": [{"name": "y", "parameters": {"binary_data": True}}]})
    body = head + x.tobytes()
    request = (b"POST /v2/models/wide/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
               % (len(head), len(body)))
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(request)
        for i in range(0, len(body), 150_001):  # pieces the server reads apart
            sock.sendall(body[i:i + 150_001])
            time.sleep(0.02)
        answer = b""
        while not _whole(answer):
            chunk = sock.recv(1 << 20)
            assert chunk, answer[:300]
            answer += chunk
    status, headers, payload = _parsed(answer)
    assert status == b"HTTP/1.1 200 OK", answer[:300]
    y = np.frombuffer(payload[int(headers[b"inference-header-content-length"]):], np.float32)
    np.testing.assert_array_equal(y, x.ravel())


def _parsed(answer: bytes) -> tuple[bytes, dict[bytes, bytes], bytes]:
    head, _, payload = answer.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (li.partition(b":") for li in lines)}
    return status, headers, payload


def _whole(answer: bytes) -> bool:
    if b"\r\n\r\n" not in answer:
        return False
    _, headers, payload = _parsed(answer)
    return len(payload) >= int(headers[b"content-length"])


def test_body_chunks_are_handed_on_without_copying_one_and_joined_when_several():
    chunks = _Chunks()
    first = bytes(range(256)) * 300
    chunks += first
    assert len(chunks) == len(first) and bytes(chunks) is first  # the very chunk: no copy
    chunks += b"tail"
    assert len(chunks) == len(first) + 4 and bytes(chunks) == first + b"tail"


def test_pipelined_requests_get_whole_answers_in_their_order(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"".join(infer(f"r{i}") for i in range(20)))
        answers = read_answers(sock, 20)
    assert [status for status, _ in answers] == [b"HTTP/1.1 200 OK"] * 20
    assert [doc["id"] for _, doc in answers] == [f"r{i}" for i in range(20)]


def test_a_closing_connection_gets_its_last_answer_first(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(infer("last").replace(b"Host: 127.0.0.1\r\n",
                                           b"Host: 127.0.0.1\r\nConnection: close\r\n"))
        (status, doc), = read_answers(sock, 1)
        assert sock.recv(1) == b""  # then the server closes
    assert status == b"HTTP/1.1 200 OK" and doc["id"] == "last"


async def _through_coalescing(writes: list[bytes], close: bool) -> bytes:
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    transport, _ = await loop.create_unix_connection(asyncio.Protocol, sock=ours)
    theirs.setblocking(False)
    out = _CoalescingTransport(transport, loop)
    for data in writes:
        out.write(data)
    if close:
        out.close()
    else:
        await asyncio.sleep(0)  # the end of the tick sends what is still held
        await asyncio.sleep(0)
        transport.close()
    received = b""
    while chunk := await loop.sock_recv(theirs, 65536):
        received += chunk
    theirs.close()
    return received


@pytest.mark.parametrize("writes", [[b"head"], [b"head", b"body"], [b"a", b"b", b"c"],
                                    [b"h" * 100_000, b"b" * 300_000]])
@pytest.mark.parametrize("close", [False, True], ids=["kept open", "closed at once"])
def test_held_writes_all_arrive_in_order(writes, close):
    assert asyncio.run(_through_coalescing(writes, close)) == b"".join(writes)
