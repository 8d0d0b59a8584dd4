"""A canary judged by its answers, on a real serving process: while the analysis runs, a
mirrored share of the stable's requests also runs on the candidate (never returned), the
replica compares the two answers and the analysis rolls back a candidate that answers
differently (the same weights with its output classes swapped: same latency) with no user
request failing, audited with the agreement figure; an identical candidate is promoted."""

from __future__ import annotations

import time

import onnx
import pytest
from onnx import numpy_helper

from registry import samples
from registry.services import analysis
from tests.conftest import CLUSTERED
from tests.replicas import replicas
from tests.test_rollouts_live import QUIET, Load, post

pytestmark = pytest.mark.django_db(transaction=True)
N = 2 if CLUSTERED else 1


def with_classes_reversed(data: bytes) -> bytes:
    """The same network with its output columns in reverse order: every argmax moves."""
    model = onnx.load_from_string(data)
    last = max(int(i.name[1:]) for i in model.graph.initializer if i.name.startswith("w"))
    for init in model.graph.initializer:
        if init.name in (f"w{last}", f"b{last}"):
            array = numpy_helper.to_array(init)[..., ::-1].copy()
            init.CopyFrom(numpy_helper.from_array(array, init.name))
    model.producer_name = "swapped"
    return model.SerializeToString()


def renamed(data: bytes, producer: str) -> bytes:
    """The same model as another file (its own sha256): identical answers."""
    model = onnx.load_from_string(data)
    model.producer_name = producer
    return model.SerializeToString()


@pytest.mark.usefixtures("analysis_ticking")
def test_a_candidate_that_answers_differently_is_rolled_back_and_an_identical_one_promoted(
        engineer, ready_model, tmp_path):
    from registry.models import AuditEvent, Endpoint

    stable = samples.mlp(seed=1)
    ready_model("answers", stable)
    ready_model("answers", with_classes_reversed(stable))
    ready_model("answers", renamed(stable, "twin"))
    with replicas(N, embedded=not CLUSTERED, log_dir=tmp_path, **QUIET) as reps:
        post(engineer, "answers", "deploy", {"version": 1})
        decided = {"endpoint.analysis.advance": "advance", "endpoint.promote": "promote",
                   "endpoint.abort": "rollback"}
        # Latency is not what is judged here: a margin no CPU load crosses (as in
        # test_rollouts_live); the answers are.
        plan = {"steps": [50, 100], "bake_seconds": 1, "min_requests": 20,
                "max_p99_ratio": 4, "min_p99_increase_ms": 1000,
                "mirror_percent": 50, "min_agreement": 0.9, "min_compared": 30}

        def judge(version: int) -> tuple[list[str], Load]:
            post(engineer, "answers", "canary", {"version": version, "plan": plan})
            after = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first()
            with Load("answers", [r.url for r in reps], threads=4) as load:
                deadline = time.monotonic() + 45
                while Endpoint.objects.get(model__name="answers").candidate_id:
                    assert time.monotonic() < deadline, "the analysis decided nothing"
                    time.sleep(0.5)
                    analysis.tick()
            return [decided[a] for a in AuditEvent.objects.filter(
                id__gt=after, actor_name="canary-analysis", action__in=decided)
                .order_by("id").values_list("action", flat=True)], load

        actions, load = judge(2)
        assert actions == ["rollback"]
        assert load.failures == [] and len(load.seen) > 0
        # what users got was always the stable's answer: the mirrored copy is never returned
        assert {v for _, _, v in load.seen} <= {"1", "2"}
        rolled = AuditEvent.objects.filter(action="endpoint.abort").latest("id")
        assert "agrees with the stable on" in rolled.reason
        agreement = rolled.after["details"]["answers"]["agreement"]
        assert agreement["compared_rows"] >= 30 and agreement["agreement"] < 0.9

        actions, load = judge(3)
        assert actions == ["advance", "promote"]
        assert load.failures == []
        ep = Endpoint.objects.select_related("stable").get(model__name="answers")
        assert ep.stable.number == 3
        promoted = AuditEvent.objects.filter(action="endpoint.promote").latest("id")
        assert promoted.after["details"]["answers"]["agreement"]["agreement"] == 1.0
