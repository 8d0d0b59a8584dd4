"""Desired and observed state as JSON: what the control plane sends a replica that follows it
over HTTP (`GET /api/v1/replica/desired-state`) and what the replica sends back as its heartbeat.
One definition for both ends, so the two planes cannot drift apart.

A version's artifact path and TensorRT cache are the receiving replica's own (its artifact
cache, its engine cache): the wire carries the artifact's sha256, never a path of the sender.
Decoding checks shapes and types and raises WireError naming the bad field.
"""

from __future__ import annotations

from collections.abc import Callable

from serving.core.capture import MODES, CaptureSettings
from serving.core.desired_state import (
    BatchingConfig,
    DesiredState,
    ModelRoute,
    ObservedState,
    VersionSpec,
)
from serving.core.pipeline_graph import PipelineError, PipelineGraph
from serving.core.rate_limits import Limits, PredictKey

#: Bumped when a field changes meaning; a replica refuses a document of another format.
FORMAT = 1
SHA256_HEX = frozenset("0123456789abcdef")


class WireError(ValueError):
    """A document that is not desired (or observed) state as this replica knows it."""


# -- encoding (control plane) -------------------------------------------------------------------

def _limits(limits: Limits) -> dict:
    return {"rps": limits.rps, "burst": limits.burst, "daily_quota": limits.daily_quota}


def _route(route: ModelRoute) -> dict:
    return {
        "stable": route.stable, "candidate": route.candidate,
        "candidate_weight": route.candidate_weight, "blue": route.blue, "green": route.green,
        "live_color": route.live_color, "shadow": route.shadow, "warm": list(route.warm),
        "mirror_percent": route.mirror_percent,
        "api_key_hashes": sorted(route.api_key_hashes), "keys_required": route.keys_required,
        "limits": _limits(route.limits),
        "keys": {h: {"label": k.label, "limits": _limits(k.limits)}
                 for h, k in sorted(route.keys.items())},
        "scale_to_zero_after_s": route.scale_to_zero_after_s,
        "capture": {"percent": route.capture.percent, "mode": route.capture.mode,
                    "max_bytes": route.capture.max_bytes},
    }


def _spec(spec: VersionSpec) -> dict:
    b = spec.batching
    return {
        "model": spec.model, "version": spec.version, "sha256": spec.sha256,
        "signature": spec.signature,
        "batching": {"max_batch_size": b.max_batch_size,
                     "preferred_batch_sizes": list(b.preferred_batch_sizes),
                     "max_queue_delay_us": b.max_queue_delay_us,
                     "max_queue_size": b.max_queue_size, "instance_count": b.instance_count},
        "intra_op_threads": spec.intra_op_threads,
        "graph_optimization_level": spec.graph_optimization_level,
        "trt_precision": spec.trt_precision, "max_output_bytes": spec.max_output_bytes,
        "pipeline": spec.pipeline.to_json() if spec.pipeline is not None else None,
        "response_cache": spec.response_cache,
    }


def encode_desired(state: DesiredState) -> dict:
    return {"format": FORMAT, "revision": state.revision,
            "routes": {m: _route(r) for m, r in sorted(state.routes.items())},
            "step_routes": {m: _route(r) for m, r in sorted(state.step_routes.items())},
            "versions": [_spec(s) for _, s in sorted(state.versions.items())]}


#: A replica sends the versions that changed since its last acknowledged heartbeat (and the
#: keys gone), `"same": true` when none did, and its whole state at least this often, so idle
#: versions still get a statistics sample a minute (and a console that lost it is told).
FULL_HEARTBEAT_EVERY_S = 60.0


def encode_observed(observed: ObservedState, *, since: dict | None = None) -> dict:
    """The heartbeat body: everything, or (`since`: the versions the control plane last
    acknowledged) only what changed since: `"same": true`, or `changed` + `removed`. The control
    plane answers 409 to a partial one when it holds no state for the replica."""
    head = {"replica": observed.replica, "revision": observed.revision,
            "degraded": observed.degraded}
    if since is None:
        return {**head, "versions": observed.versions}
    versions = observed.versions or {}
    changed = {k: v for k, v in versions.items() if since.get(k) != v}
    removed = [k for k in since if k not in versions]
    if not changed and not removed:
        return {**head, "same": True}
    return {**head, "changed": changed, "removed": removed}


# -- decoding (replica; the control plane decodes heartbeats) -----------------------------------

def _get(doc: dict, key: str, kind, where: str, *, optional: bool = False, default=None):
    value = doc.get(key, default)
    if value is None and optional:
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise WireError(f"{where}.{key}: expected {kind.__name__}, got {value!r}"[:300])
    return value


def _obj(value, where: str) -> dict:
    if type(value) is not dict:
        raise WireError(f"{where}: expected an object")
    return value


def _decode_limits(doc, where: str) -> Limits:
    doc = _obj(doc, where)
    return Limits(rps=_get(doc, "rps", float, where, default=0.0),
                  burst=_get(doc, "burst", int, where, default=0),
                  daily_quota=_get(doc, "daily_quota", int, where, default=0))


def _text(doc: dict, key: str, where: str) -> str | None:
    return _get(doc, key, str, where, optional=True)


def _decode_capture(doc, where: str) -> CaptureSettings:
    doc = _obj(doc, where)
    percent = _get(doc, "percent", float, where, default=0.0)
    mode = _get(doc, "mode", str, where, default="both")
    max_bytes = _get(doc, "max_bytes", int, where, default=CaptureSettings.max_bytes)
    if not 0 <= percent <= 100:
        raise WireError(f"{where}.percent: {percent} is not 0-100")
    if mode not in MODES:
        raise WireError(f"{where}.mode: {mode!r} is not one of {', '.join(MODES)}")
    if max_bytes < 0:
        raise WireError(f"{where}.max_bytes: {max_bytes} is negative")
    return CaptureSettings(percent=percent, mode=mode, max_bytes=max_bytes)


def _decode_route(model: str, doc, where: str) -> ModelRoute:
    doc = _obj(doc, where)
    keys = {}
    for key_hash, k in _obj(doc.get("keys", {}), f"{where}.keys").items():
        k = _obj(k, f"{where}.keys.{key_hash}")
        keys[key_hash] = PredictKey(_get(k, "label", str, f"{where}.keys"),
                                    _decode_limits(k.get("limits", {}), f"{where}.keys.limits"))
    hashes = _get(doc, "api_key_hashes", list, where, default=[])
    warm = _get(doc, "warm", list, where, default=[])
    if not all(isinstance(h, str) for h in hashes) or not all(isinstance(w, str) for w in warm):
        raise WireError(f"{where}: api_key_hashes and warm must be lists of strings")
    weight = _get(doc, "candidate_weight", int, where, default=0)
    if not 0 <= weight <= 100:
        raise WireError(f"{where}.candidate_weight: {weight} is not 0-100")
    mirror = _get(doc, "mirror_percent", int, where, default=0)
    if not 0 <= mirror <= 100:
        raise WireError(f"{where}.mirror_percent: {mirror} is not 0-100")
    color = _text(doc, "live_color", where)
    if color not in (None, "blue", "green"):
        raise WireError(f"{where}.live_color: {color!r} is not blue or green")
    return ModelRoute(
        model=model, stable=_text(doc, "stable", where), candidate=_text(doc, "candidate", where),
        candidate_weight=weight, blue=_text(doc, "blue", where),
        green=_text(doc, "green", where), live_color=color, shadow=_text(doc, "shadow", where),
        warm=tuple(warm), api_key_hashes=frozenset(hashes), mirror_percent=mirror,
        keys_required=_get(doc, "keys_required", bool, where, default=False),
        limits=_decode_limits(doc.get("limits", {}), f"{where}.limits"), keys=keys,
        scale_to_zero_after_s=_get(doc, "scale_to_zero_after_s", float, where, default=0.0),
        capture=_decode_capture(doc.get("capture", {}), f"{where}.capture"))


def _decode_spec(doc, where: str, artifact_path: Callable[[str], str],
                 trt_cache_root: str | None) -> VersionSpec:
    doc = _obj(doc, where)
    sha256 = _get(doc, "sha256", str, where)
    if len(sha256) != 64 or not set(sha256) <= SHA256_HEX:
        raise WireError(f"{where}.sha256: not a sha256 hex digest")
    b = _obj(doc.get("batching", {}), f"{where}.batching")
    preferred = _get(b, "preferred_batch_sizes", list, where, default=[])
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in preferred):
        raise WireError(f"{where}.batching.preferred_batch_sizes: integers only")
    pipeline = doc.get("pipeline")
    try:
        graph = PipelineGraph.from_json(_obj(pipeline, f"{where}.pipeline")) \
            if pipeline is not None else None
    except (PipelineError, KeyError, TypeError) as exc:
        raise WireError(f"{where}.pipeline: {exc}") from None
    return VersionSpec(
        model=_get(doc, "model", str, where), version=_get(doc, "version", str, where),
        artifact_path=artifact_path(sha256), sha256=sha256,
        signature=_get(doc, "signature", dict, where),
        batching=BatchingConfig(
            max_batch_size=_get(b, "max_batch_size", int, where, default=0),
            preferred_batch_sizes=tuple(preferred),
            max_queue_delay_us=_get(b, "max_queue_delay_us", int, where, default=0),
            max_queue_size=_get(b, "max_queue_size", int, where,
                                default=BatchingConfig.max_queue_size),
            instance_count=_get(b, "instance_count", int, where, default=1)),
        intra_op_threads=_get(doc, "intra_op_threads", int, where, default=0),
        graph_optimization_level=_get(doc, "graph_optimization_level", str, where,
                                      default="all"),
        trt_precision=_get(doc, "trt_precision", str, where, default="fp32"),
        trt_cache_root=trt_cache_root,
        max_output_bytes=_get(doc, "max_output_bytes", int, where, default=0),
        pipeline=graph, response_cache=_get(doc, "response_cache", bool, where, default=False))


def decode_desired(doc, *, artifact_path: Callable[[str], str],
                   trt_cache_root: str | None = None) -> DesiredState:
    """The desired state in `doc`; `artifact_path(sha256)` is where this replica keeps that
    artifact (fetched there before the version loads)."""
    doc = _obj(doc, "desired state")
    if doc.get("format") != FORMAT:
        raise WireError(f"desired state of format {doc.get('format')!r}; this replica reads "
                        f"format {FORMAT} (upgrade the replica to the control plane's release)")
    routes = {m: _decode_route(m, r, f"routes.{m}")
              for m, r in _obj(doc.get("routes", {}), "routes").items()}
    step_routes = {m: _decode_route(m, r, f"step_routes.{m}")
                   for m, r in _obj(doc.get("step_routes", {}), "step_routes").items()}
    versions = {}
    for i, raw in enumerate(_get(doc, "versions", list, "desired state", default=[])):
        spec = _decode_spec(raw, f"versions[{i}]", artifact_path, trt_cache_root)
        versions[spec.key] = spec
    return DesiredState(revision=_get(doc, "revision", int, "desired state"), routes=routes,
                        versions=versions, step_routes=step_routes)


def _versions(doc, where: str) -> dict:
    versions = _obj(doc, where)
    for key, state in versions.items():
        model, colon, number = key.rpartition(":")
        if not colon or not model or not number.isdigit() or type(state) is not dict:
            raise WireError(f"{where}: {key[:100]!r} must be 'model:number' with an object")
        stats = state.get("stats")
        if stats is not None and (type(stats) is not dict or not isinstance(
                stats.get("count"), int) or not isinstance(stats.get("errors"), int)
                or not isinstance(stats.get("latency_buckets"), list)):
            raise WireError(f"{where}.{key[:100]}.stats: needs count, errors (integers) and "
                            "latency_buckets (a list)")
    return versions


def decode_observed(doc, *, replica: str) -> ObservedState:
    """A heartbeat body for `replica` (the name in its URL): its whole state (versions), or
    what changed since the last acknowledged one (versions None; changed and removed, both
    empty for `"same": true`)."""
    doc = _obj(doc, "heartbeat")
    revision = _get(doc, "revision", int, "heartbeat")
    degraded = _text(doc, "degraded", "heartbeat")
    if doc.get("same") is True:
        return ObservedState(replica=replica, revision=revision, versions=None,
                             degraded=degraded, changed={})
    if "changed" in doc or "removed" in doc:
        removed = _get(doc, "removed", list, "heartbeat", default=[])
        if not all(isinstance(k, str) for k in removed):
            raise WireError("heartbeat.removed: a list of 'model:number' keys")
        return ObservedState(replica=replica, revision=revision, versions=None,
                             degraded=degraded,
                             changed=_versions(doc.get("changed", {}), "heartbeat.changed"),
                             removed=tuple(removed))
    return ObservedState(replica=replica, revision=revision,
                         versions=_versions(doc.get("versions", {}), "heartbeat.versions"),
                         degraded=degraded)
