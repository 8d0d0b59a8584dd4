"""A pipeline carries its steps' rules: a call through it must present a key each keyed step's
endpoint accepts (with the pipeline's own, as one comma-separated list), each step's rate limits
and quotas count it beside the pipeline's (admitted together or refused naming the step), and a
version loaded only to run as a step answers no call pinned to it while the pipeline serves it.
Over HTTP and gRPC, which share the data plane."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import grpc
import numpy as np
import onnx
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from registry import samples
from registry.signatures import extract_signature
from serving.core.desired_state import (
    BatchingConfig,
    DesiredState,
    ModelRoute,
    VersionSpec,
    api_key_hash,
)
from serving.core.rate_limits import Limits, PredictKey
from serving.grpc.front import GrpcFront
from tests.inprocess_replica import Clock, InProcessReplica
from tests.serving.test_pipeline_runtime import X, body, pipeline_spec

PIPE_KEY, STEP_KEY = "mmck_pipeline-key-secret", "mmck_step-key-secret"
SUM_ERROR = "step 'sum' (model 'adder') of pipeline 'p'"


def version(tmp: Path, model: str, number: str, data: bytes) -> VersionSpec:
    path = tmp / f"{model}-{number}.onnx"
    path.write_bytes(data)
    return VersionSpec(model=model, version=number, artifact_path=str(path),
                       sha256=hashlib.sha256(data).hexdigest(),
                       signature=extract_signature(onnx.load_from_string(data)),
                       batching=BatchingConfig(max_batch_size=8), intra_op_threads=1)


def keyed(model: str, key: str, **changes) -> ModelRoute:
    digest = api_key_hash(key)
    return ModelRoute(model, api_key_hashes=frozenset({digest}),
                      keys={digest: PredictKey(key[:12])}, **changes)


def state(tmp: Path, *routes: ModelRoute, step_routes=()) -> DesiredState:
    """Pipeline p:1 = adder(scaler:1(x), x) = 3x, with scaler:2 (×10) and adder:1 loaded too."""
    steps = [version(tmp, "scaler", "1", samples.scale(2.0)),
             version(tmp, "adder", "1", samples.add())]
    specs = [*steps, version(tmp, "scaler", "2", samples.scale(10.0)), pipeline_spec(steps)]
    return DesiredState(1, {r.model: r for r in routes}, {s.key: s for s in specs},
                        step_routes={r.model: r for r in step_routes})


async def replica(desired: DesiredState, mono: Clock | None = None) -> InProcessReplica:
    return await InProcessReplica("r1", desired, wall=Clock(1.9e9), mono=mono).start()


async def call(rep: InProcessReplica, path: str = "/v2/models/p/infer", headers=(), x=X):
    return await rep.http.post(path, json=body(x, name="a" if "adder" in path else "x"),
                               headers=list(headers))


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_a_keyed_step_refuses_a_call_through_an_open_pipeline_without_its_key(tmp_path):
    async def main():
        rep = await replica(state(tmp_path, ModelRoute("p", stable="1"),
                                  keyed("adder", STEP_KEY, stable="1")))
        refused = await call(rep)
        assert refused.status_code == 401, refused.text
        error = refused.json()["error"]
        assert error.startswith(f"{SUM_ERROR} needs an API key") and "comma-separated" in error
        wrong = await call(rep, headers=[("X-Api-Key", "mmck_guess")])
        assert wrong.status_code == 401
        assert wrong.json()["error"].startswith(f"API key not accepted for {SUM_ERROR}")
        ok = await call(rep, headers=[("X-Api-Key", STEP_KEY)])
        assert ok.status_code == 200, ok.text
        assert np.allclose(ok.json()["outputs"][0]["data"], (3 * np.array(X)).ravel())
        await rep.stop()

    run(main())


def test_a_keyed_pipeline_over_a_keyed_step_takes_both_keys_however_they_are_sent(tmp_path):
    async def main():
        rep = await replica(state(tmp_path, keyed("p", PIPE_KEY, stable="1"),
                                  keyed("adder", STEP_KEY, stable="1")))
        only_pipe = await call(rep, headers=[("X-Api-Key", PIPE_KEY)])
        assert only_pipe.status_code == 401 and SUM_ERROR in only_pipe.json()["error"]
        only_step = await call(rep, headers=[("X-Api-Key", STEP_KEY)])
        assert only_step.status_code == 401
        assert only_step.json()["error"] == "API key not accepted for model 'p'"
        for headers in ([("X-Api-Key", f"{PIPE_KEY}, {STEP_KEY}")],
                        [("X-Api-Key", STEP_KEY), ("X-Api-Key", PIPE_KEY)],
                        [("Authorization", f"Bearer {PIPE_KEY}"), ("X-Api-Key", STEP_KEY)]):
            r = await call(rep, headers=headers)
            assert r.status_code == 200, (headers, r.text)
        many = await call(rep, headers=[("X-Api-Key", ",".join([PIPE_KEY] * 9))])
        assert many.status_code == 400 and "at most 8 predict keys" in many.json()["error"]
        # Each endpoint counted the call under its own key.
        assert rep.admission.requests == {("p", PIPE_KEY[:12]): 3, ("adder", STEP_KEY[:12]): 3}
        await rep.stop()

    run(main())


def test_a_steps_rate_limit_counts_calls_through_the_pipeline_and_refuses_naming_it(tmp_path):
    async def main():
        rep = await replica(state(tmp_path, ModelRoute("p", stable="1", limits=Limits(rps=50)),
                                  ModelRoute("adder", stable="1", limits=Limits(rps=5))),
                            mono=Clock(100.0))  # no time passes: no token comes back
        codes = [(await call(rep)).status_code for _ in range(5)]
        assert codes == [200] * 5
        refused = await call(rep)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"] == (
            f"{SUM_ERROR}: rate limit of model 'adder' exceeded: 5 requests per second "
            "(burst 5) on each replica")
        # The step's own callers share that limit, and the refusal took nothing of the pipeline's.
        direct = await call(rep, "/v2/models/adder/infer")
        assert direct.status_code == 429
        assert rep.admission.requests == {("p", "none"): 5, ("adder", "none"): 5}
        assert rep.admission.rejected == {("adder", "none", "endpoint_rate"): 2}
        await rep.stop()

    run(main())


def test_a_step_model_whose_endpoint_serves_nothing_still_binds_calls_with_its_rules(tmp_path):
    async def main():
        rules = keyed("adder", STEP_KEY, limits=Limits(daily_quota=2))
        rep = await replica(state(tmp_path, ModelRoute("p", stable="1"), step_routes=[rules]))
        assert (await call(rep)).status_code == 401
        ok = [(await call(rep, headers=[("X-Api-Key", STEP_KEY)])).status_code
              for _ in range(3)]
        assert ok == [200, 200, 429]
        assert (await call(rep, "/v2/models/adder/versions/1/infer")).status_code == 404
        await rep.stop()

    run(main())


def test_a_version_loaded_only_as_a_step_answers_no_pinned_call_while_the_pipeline_runs_it(
        tmp_path):
    async def main():
        rep = await replica(state(tmp_path, ModelRoute("p", stable="1"),
                                  ModelRoute("scaler", stable="2")))
        pinned = await call(rep, "/v2/models/scaler/versions/1/infer")
        assert pinned.status_code == 404
        assert pinned.json()["error"] == (
            "model 'scaler' version '1' is not deployed: it runs on this replica only as a "
            "pipeline step, so only calls to that pipeline reach it")
        assert (await rep.http.get("/v2/models/scaler/versions/1")).status_code == 404
        ready = await rep.http.get("/v2/models/scaler/versions/1/ready")
        assert ready.status_code != 200
        assert (await rep.http.get("/v2/models/scaler")).json()["versions"] == ["2"]
        # The pipeline runs it (3x), the model's own version answers its own calls (10x).
        through = await call(rep)
        assert np.allclose(through.json()["outputs"][0]["data"], (3 * np.array(X)).ravel())
        own = await call(rep, "/v2/models/scaler/versions/2/infer")
        assert np.allclose(own.json()["outputs"][0]["data"], (10 * np.array(X)).ravel())
        # Its statistics are still there to read.
        stats = (await rep.http.get("/v2/models/scaler/versions/1/stats")).json()
        assert stats["model_stats"][0]["inference_stats"]["success"]["count"] == 1
        await rep.stop()

    run(main())


def test_over_grpc_a_keyed_step_needs_its_key_and_a_step_only_version_is_not_found(tmp_path):
    request = pb.ModelInferRequest(
        model_name="p", inputs=[pb.ModelInferRequest.InferInputTensor(
            name="x", datatype="FP32", shape=[2, 4])],
        raw_input_contents=[np.array(X, np.float32).tobytes()])

    async def main():
        rep = await replica(state(tmp_path, ModelRoute("p", stable="1"),
                                  keyed("adder", STEP_KEY, stable="1"),
                                  ModelRoute("scaler", stable="2")))
        front = GrpcFront(rep.dataplane, host="127.0.0.1", port=0, max_message_bytes=1 << 20)
        await front.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.ModelInfer(request)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert refused.value.details().startswith(f"{SUM_ERROR} needs an API key")
                answer = await stub.ModelInfer(request, metadata=[("x-api-key", STEP_KEY)])
                y = np.frombuffer(answer.raw_output_contents[0], np.float32)
                assert np.allclose(y, (3 * np.array(X)).ravel())
                pinned = pb.ModelInferRequest()
                pinned.CopyFrom(request)
                pinned.model_name, pinned.model_version = "scaler", "1"
                with pytest.raises(grpc.aio.AioRpcError) as hidden:
                    await stub.ModelInfer(pinned)
                assert hidden.value.code() == grpc.StatusCode.NOT_FOUND
                assert "only as a pipeline step" in hidden.value.details()
        finally:
            await front.stop(1)
            await rep.stop()

    run(main())
