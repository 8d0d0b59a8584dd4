"""The dynamic batcher: requests merge under load, every caller gets exactly its own rows back,
the queue is bounded, a failing batch fails only its own callers."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from registry import samples
from serving.core.batching import DynamicBatcher
from serving.core.desired_state import BatchingConfig
from serving.core.errors import ModelNotReady, QueueFull
from serving.core.runtime import OnnxRuntime
from serving.core.stats import VersionStats


@pytest.fixture(scope="module")
def mlp() -> OnnxRuntime:
    rt = OnnxRuntime(samples.mlp(), intra_op_threads=1).load()
    rt.warmup()
    return rt


@pytest.fixture(scope="module")
def lookup() -> OnnxRuntime:
    """Gather rows of a 10 x 4 table by INT64 index: an index >= 10 fails at run time."""
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "idx"], ["y"], axis=0)], "lookup",
        [helper.make_tensor_value_info("idx", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(table, "table")],
    )
    model = helper.make_model(graph, ir_version=samples.IR_VERSION,
                              opset_imports=[helper.make_opsetid("", samples.OPSET)])
    return OnnxRuntime(model.SerializeToString(), intra_op_threads=1).load()


def batcher(rt: OnnxRuntime, **config) -> DynamicBatcher:
    return DynamicBatcher(rt.predict, BatchingConfig(**config), VersionStats("m", "1"))


def distinct_inputs(n: int, seed: int = 0) -> list[np.ndarray]:
    """n requests of 1..3 rows each, all different, so a mixed-up row would show."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1 + i % 3, 64)).astype(np.float32) for i in range(n)]


def test_an_idle_request_runs_at_once_and_returns_the_model_output(mlp):
    b = batcher(mlp, max_batch_size=32)
    x = np.ones((2, 64), np.float32)
    out = asyncio.run(b.infer({"x": x}))
    np.testing.assert_array_equal(out["y"], mlp.predict({"x": x})["y"])
    s = b.stats
    assert (s.execution_count, s.inference_count, s.success_count) == (1, 2, 1)
    assert s.pending == 0 and b.queue_depth == 0


def test_concurrent_requests_share_executions_and_each_caller_gets_its_own_rows(mlp):
    b = batcher(mlp, max_batch_size=16)
    xs = distinct_inputs(64)

    async def main():
        return await asyncio.gather(*(b.infer({"x": x}) for x in xs))

    outs = asyncio.run(main())
    for x, out in zip(xs, outs, strict=True):
        np.testing.assert_allclose(out["y"], mlp.predict({"x": x})["y"], rtol=1e-5, atol=1e-6)
    s = b.stats
    assert s.inference_count == sum(len(x) for x in xs)
    assert s.execution_count < len(xs) < s.inference_count
    assert s.success_count == len(xs) and s.fail_count == 0
    assert max(s.batch_stats) <= 16
    assert sum(v[0] for v in s.batch_stats.values()) == s.execution_count


def test_concurrent_callers_in_a_steady_stream_are_batched(mlp):
    b = batcher(mlp, max_batch_size=32)
    xs = distinct_inputs(16, seed=3)

    async def caller(x):
        for _ in range(20):
            out = await b.infer({"x": x})
            np.testing.assert_allclose(out["y"], mlp.predict({"x": x})["y"], rtol=1e-5,
                                       atol=1e-6)

    async def main():
        await asyncio.gather(*(caller(x) for x in xs))

    asyncio.run(main())
    assert b.stats.success_count == 16 * 20
    assert b.stats.execution_count < b.stats.success_count


def test_max_batch_size_zero_runs_every_request_on_its_own(mlp):
    b = batcher(mlp, max_batch_size=0)
    xs = distinct_inputs(10)

    async def main():
        return await asyncio.gather(*(b.infer({"x": x}) for x in xs))

    outs = asyncio.run(main())
    for x, out in zip(xs, outs, strict=True):
        np.testing.assert_array_equal(out["y"], mlp.predict({"x": x})["y"])
    assert b.stats.execution_count == 10


def test_requests_with_different_trailing_shapes_are_not_merged():
    rt = OnnxRuntime(samples.identity(TensorProto.FLOAT, ["batch", "n"])).load()
    b = batcher(rt, max_batch_size=8)
    xs = [np.full((1, 1 + i % 2), i, np.float32) for i in range(6)]

    async def main():
        return await asyncio.gather(*(b.infer({"x": x}) for x in xs))

    outs = asyncio.run(main())
    for x, out in zip(xs, outs, strict=True):
        np.testing.assert_array_equal(out["y"], x)
    assert b.stats.execution_count == 2
    assert b.stats.batch_stats == {3: [2, *b.stats.batch_stats[3][1:]]}


def test_bytes_requests_batch_and_come_back_to_their_callers():
    rt = OnnxRuntime(samples.identity(TensorProto.STRING, ["batch", 2])).load()
    b = batcher(rt, max_batch_size=8)
    xs = [np.array([[f"r{i}a".encode(), f"r{i}b".encode()]], dtype=object) for i in range(5)]

    async def main():
        return await asyncio.gather(*(b.infer({"x": x}) for x in xs))

    outs = asyncio.run(main())
    assert [o["y"].tolist() for o in outs] == [x.tolist() for x in xs]
    assert b.stats.execution_count == 1


def test_a_full_queue_refuses_with_queue_full_and_counts_a_failure(mlp):
    b = batcher(mlp, max_batch_size=4, max_queue_size=3)
    x = np.ones((1, 64), np.float32)

    async def main():
        return await asyncio.gather(*(b.infer({"x": x}) for _ in range(5)),
                                    return_exceptions=True)

    results = asyncio.run(main())
    refused = [r for r in results if isinstance(r, QueueFull)]
    assert len(refused) == 2
    assert refused[0].status == 503 and "Retry-After" in refused[0].headers
    assert "queue full" in refused[0].message
    assert sum(isinstance(r, dict) for r in results) == 3
    assert b.stats.fail_count == 2 and b.stats.success_count == 3


def test_a_failing_batch_fails_only_its_own_callers(lookup):
    b = batcher(lookup, max_batch_size=2)
    # Six one-row requests form three batches of two, in arrival order; request 2 asks for
    # row 99 of a 10-row table, so the batch [2, 3] fails and the others succeed.
    indexes = [0, 1, 99, 3, 4, 5]

    async def main():
        return await asyncio.gather(
            *(b.infer({"idx": np.array([i], np.int64)}) for i in indexes),
            return_exceptions=True)

    results = asyncio.run(main())
    assert [isinstance(r, Exception) for r in results] == [False, False, True, True, False,
                                                           False]
    for i, r in zip(indexes, results, strict=True):
        if not isinstance(r, Exception):
            assert r["y"].tolist() == [[4.0 * i + k for k in range(4)]]
    s = b.stats
    assert (s.success_count, s.fail_count, s.execution_count) == (4, 2, 2)


def test_with_a_queue_delay_a_lone_request_waits_for_company_then_goes_alone(mlp):
    b = batcher(mlp, max_batch_size=8, max_queue_delay_us=50_000)
    x = np.ones((1, 64), np.float32)
    started = time.perf_counter()
    asyncio.run(b.infer({"x": x}))
    assert time.perf_counter() - started >= 0.045
    assert b.stats.execution_count == 1
    assert b.stats.queue_ns >= 45_000_000


def test_with_a_queue_delay_late_arrivals_join_the_waiting_batch(mlp):
    b = batcher(mlp, max_batch_size=4, max_queue_delay_us=2_000_000)
    xs = distinct_inputs(4, seed=7)
    xs = [x[:1] for x in xs]

    async def main():
        first = asyncio.ensure_future(b.infer({"x": xs[0]}))
        await asyncio.sleep(0.01)
        rest = [b.infer({"x": x}) for x in xs[1:]]
        return await asyncio.wait_for(asyncio.gather(first, *rest), timeout=1.5)

    outs = asyncio.run(main())  # a full batch leaves before the 2 s delay is spent
    for x, out in zip(xs, outs, strict=True):
        np.testing.assert_allclose(out["y"], mlp.predict({"x": x})["y"], rtol=1e-5, atol=1e-6)
    assert b.stats.execution_count == 1 and set(b.stats.batch_stats) == {4}


def test_a_preferred_batch_size_leaves_without_waiting_for_the_delay(mlp):
    b = batcher(mlp, max_batch_size=8, preferred_batch_sizes=(2,), max_queue_delay_us=5_000_000)
    x = np.ones((1, 64), np.float32)

    async def main():
        return await asyncio.wait_for(
            asyncio.gather(b.infer({"x": x}), b.infer({"x": x})), timeout=2.5)

    asyncio.run(main())
    assert set(b.stats.batch_stats) == {2}


def test_drain_waits_for_in_flight_work_and_close_refuses_new_requests(mlp):
    b = batcher(mlp, max_batch_size=8)
    xs = distinct_inputs(20)

    async def main():
        tasks = [asyncio.ensure_future(b.infer({"x": x})) for x in xs]
        await asyncio.sleep(0)
        await b.drain()
        assert all(t.done() for t in tasks)
        assert b.queue_depth == 0 and b.in_flight == 0
        b.close()
        with pytest.raises(ModelNotReady):
            await b.infer({"x": xs[0]})

    asyncio.run(main())
    assert b.stats.success_count == 20


def test_a_caller_that_goes_away_does_not_disturb_the_others(mlp):
    b = batcher(mlp, max_batch_size=4)
    xs = distinct_inputs(8, seed=5)

    async def main():
        tasks = [asyncio.ensure_future(b.infer({"x": x})) for x in xs]
        await asyncio.sleep(0)
        tasks[5].cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        await b.drain()
        return done

    outs = asyncio.run(main())
    assert isinstance(outs[5], asyncio.CancelledError)
    for i, (x, out) in enumerate(zip(xs, outs, strict=True)):
        if i != 5:
            np.testing.assert_allclose(out["y"], mlp.predict({"x": x})["y"], rtol=1e-5,
                                       atol=1e-6)
    assert b.stats.pending == 0


def test_stats_account_for_queue_and_compute_time(mlp):
    b = batcher(mlp, max_batch_size=8, instance_count=2)
    xs = distinct_inputs(12)

    async def main():
        await asyncio.gather(*(b.infer({"x": x}) for x in xs))

    asyncio.run(main())
    t = b.stats.to_triton()
    inf = t["inference_stats"]
    assert inf["success"]["count"] == inf["queue"]["count"] == 12
    assert inf["compute_infer"]["count"] == 12 and inf["compute_infer"]["ns"] > 0
    assert inf["success"]["ns"] >= inf["queue"]["ns"]
    assert t["inference_count"] == sum(len(x) for x in xs)
    assert t["last_inference"] > 0


class Recording:
    """A run function that notes which thread ran each batch; `pause` seconds per run."""

    def __init__(self, pause: float = 0.0) -> None:
        self.pause = pause
        self.threads: list[int] = []

    def __call__(self, feeds):
        self.threads.append(threading.get_ident())
        if self.pause:
            time.sleep(self.pause)
        return {"y": feeds["x"] * 2}


def one_by_one(b: DynamicBatcher, n: int) -> tuple[int, list]:
    """n requests in a row on one event loop: its thread id and every answer."""
    async def main():
        answers = [await b.infer({"x": np.full((1, 2), i, np.float32)}) for i in range(n)]
        return threading.get_ident(), answers
    return asyncio.run(main())


def test_a_quick_model_runs_on_the_event_loop_once_its_runs_are_measured():
    run = Recording()
    b = DynamicBatcher(run, BatchingConfig(max_batch_size=8), VersionStats("m", "1"))
    loop_thread, answers = one_by_one(b, 40)
    assert run.threads[0] != loop_thread  # the first run, not yet measured, goes to a thread
    assert loop_thread in run.threads[1:]  # a model this quick skips the hand-off
    assert b.runs_inline
    assert [a["y"].tolist() for a in answers] == [[[2.0 * i] * 2] for i in range(40)]
    assert b.stats.execution_count == 40 and b.stats.success_count == 40


def test_a_slow_model_stays_in_the_worker_threads():
    run = Recording(pause=0.002)  # 2 ms a run, several times the inline bound
    b = DynamicBatcher(run, BatchingConfig(max_batch_size=8), VersionStats("m", "1"))
    loop_thread, _ = one_by_one(b, 6)
    assert loop_thread not in run.threads and not b.runs_inline


def test_a_model_that_turns_slow_goes_back_to_the_worker_threads():
    run = Recording()
    b = DynamicBatcher(run, BatchingConfig(max_batch_size=8), VersionStats("m", "1"))

    async def main():
        for _ in range(20):
            await b.infer({"x": np.ones((1, 2), np.float32)})
        quick = b.runs_inline
        run.pause = 0.005
        for _ in range(6):
            await b.infer({"x": np.ones((1, 2), np.float32)})
        return quick, threading.get_ident()

    quick, loop_thread = asyncio.run(main())
    assert quick and not b.runs_inline
    assert run.threads[-1] != loop_thread


def test_a_failing_batch_on_the_event_loop_fails_only_its_own_callers(lookup):
    b = batcher(lookup, max_batch_size=1)
    # measured quick (a moving average of run times): later batches run on the loop. Five runs
    # were not always enough beside busy processes: one preempted run holds the average up.
    for i in range(200):
        asyncio.run(b.infer({"idx": np.array([i % 10], np.int64)}))
        if b.runs_inline:
            break
    assert b.runs_inline

    async def main():
        return await asyncio.gather(
            *(b.infer({"idx": np.array([i], np.int64)}) for i in [1, 99, 2]),
            return_exceptions=True)

    ok1, bad, ok2 = asyncio.run(main())
    assert isinstance(bad, Exception)
    assert ok1["y"].tolist() == [[4.0, 5.0, 6.0, 7.0]] and ok2["y"].tolist() == [[8, 9, 10, 11]]
