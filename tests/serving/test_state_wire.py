"""The desired state's wire format (serving.core.state_wire): what the control plane encodes a
replica decodes to the same routes and specs, the artifact path and engine cache its own; a
malformed document is refused naming the field."""

from __future__ import annotations

import pytest

from serving.core.desired_state import (
    BatchingConfig,
    DesiredState,
    ModelRoute,
    ObservedState,
    VersionSpec,
)
from serving.core.pipeline_graph import PipelineGraph
from serving.core.rate_limits import Limits, PredictKey
from serving.core.state_wire import (
    WireError,
    decode_desired,
    decode_observed,
    encode_desired,
    encode_observed,
)

SHA = "ab" * 32
PIPE_SHA = "cd" * 32
SIG = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
       "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}]}


def state() -> DesiredState:
    key = PredictKey("k1abc", Limits(rps=5.0, burst=10, daily_quota=1000))
    route = ModelRoute(model="fraud", stable="1", candidate="2", candidate_weight=25,
                       shadow="3", warm=("4",), api_key_hashes=frozenset({"h1", "h2"}),
                       keys_required=True, limits=Limits(rps=100.0), keys={"h1": key},
                       scale_to_zero_after_s=30.0)
    bg = ModelRoute(model="bg", blue="1", green="2", live_color="green")
    spec = VersionSpec(model="fraud", version="1", artifact_path="/registry/blobs/x",
                       sha256=SHA, signature=SIG,
                       batching=BatchingConfig(max_batch_size=8, preferred_batch_sizes=(4, 8),
                                               max_queue_delay_us=500, max_queue_size=64,
                                               instance_count=2),
                       intra_op_threads=2, graph_optimization_level="basic",
                       trt_precision="fp16", trt_cache_root="/registry/trt",
                       max_output_bytes=1024, response_cache=True)
    graph = PipelineGraph.from_json({
        "steps": [{"name": "a", "model": "fraud", "version": "1"}],
        "edges": [{"from": "x", "to": "a.x"}, {"from": "a.y", "to": "y"}]})
    pipe = VersionSpec(model="pipe", version="1", artifact_path="/registry/blobs/p",
                       sha256=PIPE_SHA, signature=SIG, pipeline=graph)
    return DesiredState(revision=42, routes={"fraud": route, "bg": bg},
                        versions={spec.key: spec, pipe.key: pipe},
                        step_routes={"steps-only": ModelRoute(model="steps-only")})


def test_what_the_control_plane_encodes_a_replica_decodes_with_its_own_paths():
    sent = state()
    got = decode_desired(encode_desired(sent), artifact_path=lambda sha: f"/cache/{sha}",
                         trt_cache_root="/cache/trt")
    assert got.revision == 42 and got.routes == sent.routes
    assert got.routes["fraud"].keys == sent.routes["fraud"].keys
    assert got.step_routes == sent.step_routes
    for key, spec in sent.versions.items():
        mine = got.versions[key]
        assert mine.artifact_path == f"/cache/{spec.sha256}"
        assert mine.trt_cache_root == "/cache/trt"
        for field in ("model", "version", "sha256", "signature", "batching", "intra_op_threads",
                      "graph_optimization_level", "trt_precision", "max_output_bytes",
                      "response_cache"):
            assert getattr(mine, field) == getattr(spec, field), field
    assert got.versions[("pipe", "1")].pipeline.to_json() == \
        sent.versions[("pipe", "1")].pipeline.to_json()
    assert "/registry" not in str(encode_desired(sent))  # no path of the sender's


@pytest.mark.parametrize("spoil, field", [
    (lambda d: d.update(format=99), "format"),
    (lambda d: d["routes"]["fraud"].update(candidate_weight=101), "candidate_weight"),
    (lambda d: d["routes"]["bg"].update(live_color="red"), "live_color"),
    (lambda d: d["versions"][0].update(sha256="../../etc/passwd"), "sha256"),
    (lambda d: d["versions"][0]["batching"].update(preferred_batch_sizes=["4"]),
     "preferred_batch_sizes"),
    (lambda d: d["versions"][1].update(pipeline={"steps": "x"}), "pipeline"),
    (lambda d: d.update(revision="42"), "revision"),
    (lambda d: d["routes"].update(fraud=[]), "routes.fraud"),
])
def test_a_malformed_desired_state_is_refused_naming_the_field(spoil, field):
    doc = encode_desired(state())
    spoil(doc)
    with pytest.raises(WireError, match=field):
        decode_desired(doc, artifact_path=lambda sha: sha)


def test_a_heartbeat_round_trips_and_a_bad_one_names_what_is_wrong():
    observed = ObservedState(replica="r1", revision=7, degraded="route source unavailable",
                             versions={"fraud:1": {"state": "READY", "stats": {
                                 "count": 3, "errors": 0, "latency_buckets": [1, 2]}}})
    assert decode_observed(encode_observed(observed), replica="r1") == observed
    since = {"fraud:1": observed.versions["fraud:1"], "fraud:2": {"state": "READY"}}
    later = ObservedState(replica="r1", revision=8, versions={
        **observed.versions, "fraud:3": {"state": "LOADING"}})
    delta = decode_observed(encode_observed(later, since=since), replica="r1")
    assert delta.versions is None and delta.changed == {"fraud:3": {"state": "LOADING"}}
    assert delta.removed == ("fraud:2",) and delta.revision == 8
    same = decode_observed(encode_observed(observed, since=observed.versions), replica="r1")
    assert same.versions is None and same.changed == {} and same.removed == ()
    with pytest.raises(WireError, match="model:number"):
        decode_observed({"revision": 1, "versions": {"fraud": {}}}, replica="r1")
    with pytest.raises(WireError, match="count, errors"):
        decode_observed({"revision": 1, "versions": {"fraud:1": {"stats": {"count": "3"}}}},
                        replica="r1")
    with pytest.raises(WireError, match="removed"):
        decode_observed({"revision": 1, "changed": {}, "removed": [3]}, replica="r1")
    with pytest.raises(WireError, match="revision"):
        decode_observed({"versions": {}}, replica="r1")
