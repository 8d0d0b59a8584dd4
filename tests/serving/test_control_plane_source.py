"""The replica's side of following the control plane (serving.sources.control_plane), against a
scripted control plane (httpx.MockTransport): heartbeats carry what changed since the last
acknowledged one ("same" when nothing did) and everything when the control plane holds none; a
refusal or silence is raised with the reason; an artifact is kept only when its bytes match its
sha256."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import httpx
import pytest

from serving.core.desired_state import ObservedState, VersionSpec
from serving.core.reconciler import LoadFailed
from serving.sources.control_plane import HttpRegistrySource, SourceUnavailable

V1 = {"m:1": {"state": "READY", "stats": {"count": 1, "errors": 0, "latency_buckets": [1]}}}
V2 = {"m:1": {"state": "READY", "stats": {"count": 2, "errors": 0, "latency_buckets": [2]}}}


def source(handler, tmp_path) -> HttpRegistrySource:
    return HttpRegistrySource("http://cp", "mmcr_x_y", address="http://me:8001",
                              cache_dir=tmp_path, transport=httpx.MockTransport(handler))


def test_heartbeats_carry_what_changed_same_when_nothing_did_and_all_when_asked(tmp_path):
    sent, held = [], {"yes": True}
    V3 = {**V2, "m:2": {"state": "LOADING"}}

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert request.headers["authorization"] == "Bearer mmcr_x_y"
        if body.get("same"):
            sent.append("same")
        elif "changed" in body:
            sent.append(("changed", sorted(body["changed"]), body["removed"]))
        else:
            sent.append(("all", sorted(body["versions"])))
        if "versions" not in body and not held["yes"]:
            return httpx.Response(409, json={"error": "send all of it"})
        return httpx.Response(204)

    src = source(handler, tmp_path)
    beat = ObservedState(replica="r1", revision=1, versions=V1)
    src.report(beat)
    src.report(replace(beat, revision=2))  # same versions, new revision: "same"
    src.report(ObservedState(replica="r1", revision=2, versions=V3))  # a counter, a new one
    src.report(ObservedState(replica="r1", revision=3, versions={"m:2": V3["m:2"]}))
    held["yes"] = False  # the control plane forgot the replica: 409, then everything
    src.report(ObservedState(replica="r1", revision=3, versions={"m:2": V3["m:2"]}))
    assert sent == [("all", ["m:1"]), "same", ("changed", ["m:1", "m:2"], []),
                    ("changed", [], ["m:1"]), "same", ("all", ["m:2"])]


def test_a_refused_or_silent_control_plane_is_raised_with_its_reason(tmp_path):
    def refuse(request):
        return httpx.Response(401, json={"error": "this replica credential was revoked"})

    with pytest.raises(SourceUnavailable, match="401: this replica credential was revoked"):
        source(refuse, tmp_path).revision()

    def down(request):
        raise httpx.ConnectError("connection refused")

    with pytest.raises(SourceUnavailable, match="did not answer"):
        source(down, tmp_path).fetch()


def test_an_artifact_is_kept_only_when_its_bytes_match(tmp_path):
    good = b"onnx bytes"
    sha = hashlib.sha256(good).hexdigest()
    answers = {"body": b"tampered"}

    def handler(request):
        assert request.url.path == f"/api/v1/replica/artifacts/{sha}"
        return httpx.Response(200, content=answers["body"])

    src = source(handler, tmp_path)
    spec = VersionSpec(model="m", version="1", artifact_path=str(tmp_path / sha), sha256=sha,
                       signature={})
    with pytest.raises(LoadFailed, match="came with sha256"):
        src.fetch_artifact(spec)
    assert not (tmp_path / sha).exists() and not list(tmp_path.glob(".*part"))
    answers["body"] = good
    src.fetch_artifact(spec)
    assert (tmp_path / sha).read_bytes() == good


def test_a_shed_heartbeat_waits_the_pause_the_control_plane_asked_for(tmp_path):
    sent = []

    def handler(request):
        sent.append(request.url.path)
        return httpx.Response(503, headers={"Retry-After": "30"},
                              json={"error": "storing other replicas' heartbeats"})

    src = source(handler, tmp_path)
    beat = ObservedState(replica="r1", revision=1, versions=V1)
    with pytest.raises(SourceUnavailable, match="503"):
        src.report(beat)
    src.report(beat)  # within the 30 s asked for: nothing sent, nothing raised
    assert len(sent) == 1
