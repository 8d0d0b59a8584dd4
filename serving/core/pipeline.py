"""A pipeline on a replica: a runtime whose inference runs the graph's steps, each through the
step version's own batcher as the current route table has it loaded. So every step is batched,
counted and reloaded like any version, and the pipeline itself is one more LoadedVersion to the
data plane: picked by its route (canary, rollback, pinning), counted in its own statistics.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

import numpy as np

from serving.core.dataplane import _runtime_error
from serving.core.desired_state import DEFAULT_MAX_OUTPUT_BYTES
from serving.core.errors import ModelNotReady, ServingError
from serving.core.pipeline_graph import PipelineGraph, Step
from serving.core.stats import VersionStats

Tensors = dict[str, np.ndarray]


class PipelineRuntime:
    """The runtime interface (load, unload, metadata, text_inputs) over a graph; `run` is the
    pipeline's inference. `lookup` returns the loaded step version (or None) from the table
    the replica serves now, so a step reloaded with new settings is used at once."""

    providers: list[str] = []

    def __init__(self, graph: PipelineGraph, signature: dict,
                 lookup: Callable[[tuple[str, str]], Any], *,
                 max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES) -> None:
        self.graph = graph
        self.signature = signature
        self.lookup = lookup
        self.max_output_bytes = max_output_bytes
        self._levels = graph.levels()
        self._loaded = False

    def load(self) -> PipelineRuntime:
        self._loaded = True
        return self

    @property
    def loaded(self) -> bool:
        return self._loaded

    def unload(self) -> None:
        self._loaded = False

    def text_inputs(self, inputs: Tensors) -> Tensors:
        """Each step decodes its own text inputs (DataPlane asks every runtime for this)."""
        return inputs

    def metadata(self) -> dict:
        return {"inputs": self.signature.get("inputs", []),
                "outputs": self.signature.get("outputs", []), "providers": [],
                "steps": [{"name": s.name, "model": s.model, "version": s.version}
                          for s in self.graph.steps]}

    async def run(self, inputs: Tensors) -> Tensors:
        """The pipeline's outputs: steps level by level (a level's steps concurrently)."""
        values: dict[tuple[str, str], np.ndarray] = {("", k): v for k, v in inputs.items()}
        for level in self._levels:
            results = await asyncio.gather(*(self._step(s, values) for s in level))
            for step, outputs in zip(level, results, strict=True):
                for name, array in outputs.items():
                    values[(step.name, name)] = array
        return {name: values[source] for name, source in self.graph.outputs()}

    async def _step(self, step: Step, values: dict) -> Tensors:
        lv = self.lookup(step.key)
        if lv is None:
            raise ModelNotReady(f"pipeline step '{step.name}' ({step.model}:{step.version}) is "
                                "not loaded on this replica", retry_after=1)
        feeds = {name: values[source] for name, source in self.graph.feeds_of(step.name)}
        try:
            return await lv.batcher.infer(lv.runtime.text_inputs(feeds))
        except Exception as exc:  # noqa: BLE001 - worded once, naming the step
            raise self._step_error(step, lv, exc) from None

    def _step_error(self, step: Step, lv, exc: Exception) -> ServingError:
        """The step's error as the data plane words any version's, prefixed with the step:
        the status stays (a step refusing the values it got is still the client's 400)."""
        if not isinstance(exc, ServingError):
            exc = _runtime_error(step.model, step.version, exc,
                                lv.spec.max_output_bytes or self.max_output_bytes)
        worded = copy.copy(exc)  # not in place: one batch's error reaches several requests
        worded.message = f"pipeline step '{step.name}': {exc.message}"
        worded.args = (worded.message,)
        return worded


class PipelineBatcher:
    """What the data plane awaits for a pipeline version, shaped like a DynamicBatcher: the
    batching happens in the steps' batchers; this counts the pipeline's own requests."""

    def __init__(self, runtime: PipelineRuntime, stats: VersionStats) -> None:
        self.runtime = runtime
        self.stats = stats
        self._in_flight = 0
        self._closed = False
        self._idle: asyncio.Event | None = None

    @property
    def queue_depth(self) -> int:
        return 0

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def infer(self, inputs: Tensors, trace=None, capture=None) -> Tensors:
        """The pipeline's outputs (a trace gets no spans of its steps' batches; `capture`: the
        request's capture Ticket when it is sampled, offered once it is answered)."""
        stats = self.stats
        if self._closed:
            stats.record_failure(0)
            raise ModelNotReady(f"pipeline {stats.model!r} version {stats.version!r} is "
                                "unloading", retry_after=1)
        self._in_flight += 1
        started = perf_counter_ns()
        try:
            outputs = await self.runtime.run(inputs)
        except BaseException:
            stats.record_failure(perf_counter_ns() - started)
            raise
        finally:
            self._in_flight -= 1
            if not self._in_flight and self._idle is not None:
                self._idle.set()
        took = perf_counter_ns() - started
        rows = next(iter(inputs.values())).shape[0] if inputs and next(
            iter(inputs.values())).ndim else 1
        stats.record_execution(1, rows, 0, took, 0)
        stats.record_success(took)
        if capture is not None:
            capture.queue.offer_ticket(capture, inputs, outputs)
        return outputs

    async def drain(self) -> None:
        while self._in_flight:
            self._idle = asyncio.Event()
            await self._idle.wait()

    def close(self) -> None:
        self._closed = True
