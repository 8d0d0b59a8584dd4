"""The smallest ASGI app that answers a v2 inference request: the limit of the Python HTTP path.

uvicorn + uvloop + httptools + orjson; parses v2 JSON or the binary tensor extension (FP32 only),
runs one onnxruntime session per model and answers v2 JSON. No routing table, validation,
batching or metrics: `POST /v2/models/<name>/infer` and `GET /v2/health/ready`, nothing else.

    python bench/bare_asgi.py --models DIR --port PORT [--threads 1]

DIR holds `<name>.onnx` files.
"""

from __future__ import annotations

import argparse
import pathlib

import numpy as np
import onnxruntime as ort
import orjson
import uvicorn

SESSIONS: dict[str, tuple[ort.InferenceSession, str, str]] = {}
JSON_HEADERS = [(b"content-type", b"application/json")]


async def _body(receive) -> bytes:
    msg = await receive()
    body = msg.get("body", b"")
    if not msg.get("more_body"):
        return body
    parts = [body]
    while msg.get("more_body"):
        msg = await receive()
        parts.append(msg.get("body", b""))
    return b"".join(parts)


async def _send(send, status: int, payload: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": JSON_HEADERS})
    await send({"type": "http.response.body", "body": payload})


async def app(scope, receive, send):
    if scope["type"] != "http":  # lifespan is off; nothing else is served
        return
    path = scope["path"]
    if scope["method"] == "GET":
        await _send(send, 200 if path == "/v2/health/ready" else 404, b"{}")
        return
    body = await _body(receive)
    name = path.split("/")[3]  # /v2/models/<name>/infer
    sess, in_name, out_name = SESSIONS[name]
    hlen = None
    for k, v in scope["headers"]:
        if k == b"inference-header-content-length":
            hlen = int(v)
            break
    if hlen is None:
        req = orjson.loads(body)
        inp = req["inputs"][0]
        x = np.asarray(inp["data"], dtype=np.float32).reshape(inp["shape"])
    else:
        req = orjson.loads(body[:hlen])
        inp = req["inputs"][0]
        x = np.frombuffer(body, dtype=np.float32, offset=hlen).reshape(inp["shape"])
    y = sess.run([out_name], {in_name: x})[0]
    resp = {"model_name": name, "model_version": "1", "id": req.get("id", ""),
            "outputs": [{"name": out_name, "shape": list(y.shape), "datatype": "FP32",
                         "data": y.ravel()}]}
    await _send(send, 200, orjson.dumps(resp, option=orjson.OPT_SERIALIZE_NUMPY))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--threads", type=int, default=1, help="onnxruntime intra_op threads")
    a = p.parse_args()
    for f in sorted(pathlib.Path(a.models).glob("*.onnx")):
        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(str(f), so, providers=["CPUExecutionProvider"])
        SESSIONS[f.stem] = (sess, sess.get_inputs()[0].name, sess.get_outputs()[0].name)
    uvicorn.run(app, host=a.host, port=a.port, loop="uvloop", http="httptools",
                lifespan="off", access_log=False, log_level="warning")


if __name__ == "__main__":
    main()
