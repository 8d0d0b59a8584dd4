"""The response cache as a version's owner turns it on: one audited service behind the REST API
and the version page's serving form, carried to the replicas in the route table, and the
replicas' hit and miss counts read back on the version page."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from registry import samples, services
from registry.audit import Actor
from registry.errors import InvalidRequest
from registry.integrations.export import triton_export
from registry.models import AuditEvent, ModelVersion
from registry.notify import current_revision
from registry.serving_source import RegistrySource, build_desired_state
from serving.core.dataplane import DataPlane
from serving.core.reconciler import Reconciler

pytestmark = pytest.mark.django_db(transaction=True)  # build_desired_state sets its isolation

API = "/api/v1/models/fraud/versions/1/"
ROW = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)


@pytest.fixture
def fraud(ready_model):
    ready_model("fraud", samples.mlp(seed=0))
    services.endpoint_deploy(model_name="fraud", version_number=1, actor=Actor.system("test"))
    return "fraud"


def test_the_api_turns_the_cache_on_audited_and_every_replica_is_told(fraud, engineer):
    assert engineer.get(API).json()["response_cache"] is False  # off by default
    before = current_revision()
    r = engineer.patch(API, {"response_cache": True}, format="json")
    assert r.status_code == 200 and r.json()["response_cache"] is True
    event = AuditEvent.objects.filter(action="version.configure").latest("created_at")
    assert (event.before, event.after) == ({"response_cache": False}, {"response_cache": True})
    assert current_revision() > before
    assert build_desired_state().versions[("fraud", "1")].response_cache is True
    pbtxt = triton_export(model_name="fraud").pbtxt()  # a Triton repository keeps it on
    assert "response_cache {\n  enable: true\n}" in pbtxt


def test_a_value_that_is_not_true_or_false_is_a_400_naming_it_and_changes_nothing(
        fraud, engineer):
    for bad in ("sometimes", 7, None, [True]):
        r = engineer.patch(API, {"response_cache": bad, "instance_count": 2}, format="json")
        assert r.status_code == 400, (bad, r.content)
        assert "response_cache" in r.content.decode()
    version = ModelVersion.objects.get(model__name="fraud", number=1)
    assert (version.response_cache, version.instance_count) == (False, 1)
    with pytest.raises(InvalidRequest, match="response_cache must be true or false"):
        services.version_configure(model_name="fraud", number=1, actor=Actor.system("t"),
                                   response_cache="yes")


def test_the_version_page_form_turns_it_on_and_shows_the_replicas_hits_and_misses(
        fraud, page_client):
    client = page_client("engineer")
    html = client.get("/models/fraud/versions/1/").content.decode()
    assert 'id="serving-response_cache"' in html and 'type="checkbox"' in html
    assert "Response cache: off" in html
    data = {"max_batch_size": 0, "max_queue_delay_us": 0, "max_queue_size": 256,
            "instance_count": 1, "intra_op_threads": 0, "max_output_bytes": 0,
            "preferred_batch_sizes": "", "graph_optimization_level":
                ModelVersion.objects.get(model__name="fraud", number=1).graph_optimization_level,
            "response_cache": "on"}
    page = client.post("/models/fraud/versions/1/serving/", data, follow=True).content.decode()
    assert "Serving settings saved" in page and "Response cache off → on" in page
    assert ModelVersion.objects.get(model__name="fraud", number=1).response_cache is True
    assert "no live replica serves v1 yet" in page

    # A replica follows the registry, answers the same row three times (one run, two hits),
    # and reports its heartbeat as it always does.
    dataplane = DataPlane(replica="r-cache")
    reconciler = Reconciler(RegistrySource(), dataplane, intra_op_threads=1)
    request = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32",
                           "data": ROW.ravel().tolist()}]}

    async def serve():
        import orjson

        from serving.http.codec import decode_infer_request

        await reconciler.reconcile()
        for _ in range(3):
            await dataplane.predict("fraud", None, decode_infer_request(orjson.dumps(request)))
        lv = dataplane.table.loaded[("fraud", "1")]
        assert lv.batcher.requests == 1
        await reconciler.stop(leave_seconds=0)

    asyncio.run(serve())
    RegistrySource().report(reconciler.observed())
    html = client.get("/models/fraud/versions/1/").content.decode()
    line = html.split('id="response-cache"', 1)[1].split("</p>", 1)[0]
    assert "<strong>on</strong>" in line
    assert '<span id="cache-hits">2</span> hits' in line
    assert '<span id="cache-misses">1</span> miss' in line and "(67 % hits)" in line
    assert "on 1 live replica" in line
    viewer = page_client("viewer").get("/models/fraud/versions/1/").content.decode()
    assert '<span id="cache-hits">2</span>' in viewer  # counts are for every role
