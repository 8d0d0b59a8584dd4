"""Triton's shared-memory endpoints over HTTP, adapted to the data plane's registry
(serving.core.shared_memory):

    GET  /v2/systemsharedmemory[/region/{name}]/status    -> [{"name","key","offset","byte_size"}]
    POST /v2/systemsharedmemory/region/{name}/register    {"key": "/k", "offset": 0, "byte_size": N}
    POST /v2/systemsharedmemory[/region/{name}]/unregister
    /v2/cudasharedmemory/...                              -> 501: not offered

The app reads the body and renders the answer; this module only says what a path means.
"""

from __future__ import annotations

import orjson

from serving.core.dataplane import DataPlane
from serving.core.errors import InvalidInput, MethodNotAllowed, ModelNotFound
from serving.core.shared_memory import cuda_shared_memory_refusal

#: The most bytes a register request's JSON may take.
MAX_REGISTER_BODY = 4096


def shared_memory_call(dataplane: DataPlane, method: str, parts: list[str], body: bytes,
                       path: str) -> object:
    """Do what the path `parts` (['', 'v2', 'systemsharedmemory', ...]) asks; the JSON answer."""
    if parts[2] == "cudasharedmemory":
        raise cuda_shared_memory_refusal()
    n = len(parts)
    if n == 4 and parts[3] in ("status", "unregister"):
        name, action = None, parts[3]
    elif n == 6 and parts[3] == "region" and parts[5] in ("status", "register", "unregister"):
        name, action = parts[4], parts[5]
    else:
        raise ModelNotFound(f"no such endpoint {path}")
    wanted = "GET" if action == "status" else "POST"
    if method != wanted:
        raise MethodNotAllowed(f"method {method} not allowed here (use {wanted})",
                               headers={"Allow": wanted})
    regions = dataplane.shared_memory_regions()
    if action == "status":
        return regions.status(name)
    if action == "unregister":
        if name is None:
            regions.unregister_all()
        else:
            regions.unregister(name)
        return {}
    doc = _register_request(body, name)
    regions.register(name=name, key=doc.get("key"), offset=doc.get("offset", 0),
                     byte_size=doc.get("byte_size"))
    return {}


def _register_request(body: bytes, name: str) -> dict:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"shared memory region '{name}': the register request is not valid "
                           f"JSON: {exc}") from None
    if type(doc) is not dict:
        raise InvalidInput(f"shared memory region '{name}': the register request must be a "
                           'JSON object {"key", "offset", "byte_size"}')
    return doc
