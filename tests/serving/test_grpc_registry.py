"""The gRPC front over the registry (the embedded console process, or `mmc-serve --registry`
replicas when clustered): repository load/unload act through the registry as the caller whose
API token the metadata carries, and an endpoint's predict keys guard its model over gRPC as over
HTTP."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from tritonclient.utils import InferenceServerException

from registry import samples
from tests.conftest import CLUSTERED
from tests.replicas import replicas, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _infer(client, model: str, **kwargs):
    x = tgrpc.InferInput("x", [1, 64], "FP32")
    x.set_data_from_numpy(np.full((1, 64), 0.5, np.float32))
    return client.infer(model, [x], **kwargs)


def _refused(call, *args, **kwargs) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call(*args, **kwargs)
    return info.value


def test_repository_load_and_unload_over_grpc_act_through_the_registry(engineer, admin,
                                                                       ready_model, tmp_path):
    from registry.audit import Actor
    from registry.services import token_create

    ready_model("repo", samples.mlp())
    _, token = token_create(username="engineer", name="grpc", actor=Actor.system("t"))
    bearer = {"authorization": f"Bearer {token}"}
    with replicas(1, embedded=not CLUSTERED, log_dir=tmp_path, grpc=True) as (rep,):
        client = tgrpc.InferenceServerClient(rep.grpc_address)
        wait_until(client.is_server_ready, what="gRPC ready")
        error = _refused(client.load_model, "repo")
        assert error.status() == "StatusCode.UNAUTHENTICATED" and "token" in error.message()
        client.load_model("repo", headers=bearer)
        assert engineer.get("/api/v1/models/repo/endpoint/").json()["stable"] == 1
        wait_until(lambda: client.is_model_ready("repo"), what="repo ready over gRPC")
        assert _infer(client, "repo").get_response().model_version == "1"
        index = client.get_model_repository_index(as_json=True)["models"]
        assert {"name": "repo", "version": "1", "state": "READY"} in index
        client.unload_model("repo", headers=bearer)
        assert engineer.get("/api/v1/models/repo/endpoint/").json()["stable"] is None
        actions = [e["action"] for e in admin.get("/api/v1/audit/?model=repo").json()["results"]]
        assert actions[:2] == ["endpoint.undeploy", "endpoint.deploy"]
        error = _refused(client.load_model, "ghost", headers=bearer)
        assert error.status() == "StatusCode.NOT_FOUND" and "ghost" in error.message()


def test_an_endpoint_with_predict_keys_needs_one_in_the_call_metadata(engineer, ready_model,
                                                                     tmp_path):
    ready_model("secure", samples.mlp())
    r = engineer.post("/api/v1/models/secure/endpoint/deploy/", {"version": 1}, format="json")
    assert r.status_code == 200, r.content
    key = engineer.post("/api/v1/models/secure/endpoint/keys/", {"name": "app"},
                        format="json").json()["key"]
    with replicas(1, embedded=not CLUSTERED, log_dir=tmp_path, grpc=True) as (rep,):
        client = tgrpc.InferenceServerClient(rep.grpc_address)
        wait_until(lambda: client.is_model_ready("secure"), what="secure ready over gRPC")
        error = _refused(_infer, client, "secure")
        assert error.status() == "StatusCode.UNAUTHENTICATED" and "key" in error.message()
        error = _refused(_infer, client, "secure", headers={"x-api-key": key + "x"})
        assert error.status() == "StatusCode.UNAUTHENTICATED"
        for headers in ({"x-api-key": key}, {"authorization": f"Bearer {key}"}):
            assert _infer(client, "secure", headers=headers).as_numpy("y").shape == (1, 10)
