"""Desired state as the data plane sees it: immutable snapshots built by a source (the registry),
and the per-request version picker. Nothing here touches Django or the network."""

from __future__ import annotations

import hashlib
import random
import zlib
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from serving.core.capture import CAPTURE_OFF, CaptureSettings
from serving.core.errors import NotSupported
from serving.core.pipeline_graph import PipelineGraph
from serving.core.rate_limits import NO_LIMITS, Limits, PredictKey

#: A replica's default output budget per request and version (MMC_MAX_OUTPUT_BYTES): the
#: largest answer a request may make a model produce. 256 MiB holds a batch of 8 FP32
#: segmentation maps at 21 x 512 x 512 (176 MB) while bounding a JSON answer's text (~10
#: bytes per float: ~700 MB at 64 Mi floats) to what a small replica can hold briefly.
DEFAULT_MAX_OUTPUT_BYTES = 256 * 1024 * 1024


#: A version's observed state while its model is scaled to zero on a replica: routed to, not
#: loaded; the next request loads it (a cold start). Healthy, never a failure.
SCALED_TO_ZERO = "SCALED_TO_ZERO"


def api_key_hash(raw: str) -> str:
    """How a predict key is stored by the registry and checked by replicas: one definition, so
    the two planes can never disagree."""
    return hashlib.sha256(raw.encode()).hexdigest()


@dataclass(frozen=True)
class BatchingConfig:
    """Dynamic batching for one version. max_batch_size 0 = the model has no batch dimension."""

    max_batch_size: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    max_queue_size: int = 256
    instance_count: int = 1


@dataclass(frozen=True)
class VersionSpec:
    """Everything a replica needs to load one model version, without asking anyone else."""

    model: str
    version: str
    artifact_path: str
    sha256: str
    signature: dict
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    intra_op_threads: int = 0
    graph_optimization_level: str = "all"
    # TensorRT (used only where the replica has it): the precision to run and the root of the
    # shared engine cache, so a replica reuses the engine a build job made for the same GPU.
    trt_precision: str = "fp32"
    trt_cache_root: str | None = None
    # The most bytes of outputs one request may get (larger: a 400 naming it); 0 = the
    # replica's default (DEFAULT_MAX_OUTPUT_BYTES unless MMC_MAX_OUTPUT_BYTES says otherwise).
    max_output_bytes: int = 0
    # A pipeline version: its graph of step versions (each also in the desired state); the
    # artifact is then the pipeline's JSON spec, not a model to load.
    pipeline: PipelineGraph | None = None
    # Answer repeated requests from the replica's response cache (serving.core.response_cache)
    # instead of running the model; off unless the version asks for it.
    response_cache: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.model, self.version)


@dataclass(frozen=True)
class ModelRoute:
    """Which versions of one model answer unpinned traffic, and with what share.

    With live_color set, blue-green wins: the live slot takes all traffic. Otherwise the stable
    takes (100 - candidate_weight) % and the candidate candidate_weight %. `warm` lists versions
    kept loaded without traffic (the idle colour, the previous stable in its grace period).
    """

    model: str
    stable: str | None = None
    candidate: str | None = None
    candidate_weight: int = 0
    blue: str | None = None
    green: str | None = None
    live_color: str | None = None
    shadow: str | None = None
    # While a canary analysis judges the candidate's answers: this share (whole percent) of
    # the stable's requests also runs on the candidate, compared, never returned
    # (serving/core/mirror.py).
    mirror_percent: int = 0
    warm: tuple[str, ...] = ()
    api_key_hashes: frozenset[str] = frozenset()
    # The endpoint is protected (or the registry requires predict keys everywhere,
    # MMC_REQUIRE_PREDICT_KEYS): a route without keys then refuses every request, never opens.
    keys_required: bool = False
    # Rate limit and daily quota of the whole endpoint (serving.core.rate_limits), and each
    # key's label and limits by its hash (a hash missing here is a key without limits).
    limits: Limits = NO_LIMITS
    keys: dict[str, PredictKey] = field(default_factory=dict, hash=False)
    # Scale to zero: after this many seconds with no request (and none in flight) a replica
    # unloads the model's versions and reloads them on the next request; 0 = never.
    scale_to_zero_after_s: float = 0
    # Data capture of the endpoint (serving.core.capture): off unless its percent is above 0.
    capture: CaptureSettings = CAPTURE_OFF

    def key(self, key_hash: str | None) -> PredictKey | None:
        """The key behind an accepted hash (None: the endpoint is open, no key was needed)."""
        if key_hash is None:
            return None
        return self.keys.get(key_hash) or PredictKey(label=key_hash[:8])

    @property
    def protected(self) -> bool:
        """Whether a request must show one of the route's keys (with none, nothing gets in)."""
        return bool(self.api_key_hashes) or self.keys_required

    def versions(self) -> set[str]:
        """Every version this route needs loaded on a replica."""
        vs = {self.stable, self.candidate, self.blue, self.green, self.shadow, *self.warm}
        vs.discard(None)
        return vs  # type: ignore[return-value]

    def answers_pinned(self, version: str) -> bool:
        """Whether a call pinned to `version` may reach it: one of this route's versions. A
        version loaded only as a pipeline's step is not (the pipeline runs it, nobody else)."""
        return version in (self.stable, self.candidate, self.blue, self.green, self.shadow) \
            or version in self.warm

    @property
    def live_version(self) -> str | None:
        """Blue-green: the version in the live slot (None without blue-green or if it is empty)."""
        if not self.live_color:
            return None
        return self.blue if self.live_color == "blue" else self.green

    @property
    def default_version(self) -> str | None:
        """The version an unpinned request that is not an inference is about (metadata, ready,
        config): the live slot under blue-green, else the stable, else the candidate."""
        if self.live_color:
            return self.live_version
        return self.stable or self.candidate

    def serving_versions(self) -> set[str]:
        """Versions that may answer unpinned traffic right now."""
        if self.live_color:
            live = self.live_version
            return {live} if live else set()
        vs = set()
        if self.stable and self.candidate_weight < 100:
            vs.add(self.stable)
        if self.candidate and self.candidate_weight > 0:
            vs.add(self.candidate)
        return vs

    def pick(self, sticky_key: str | None = None, rnd: random.Random | None = None) -> str | None:
        """Choose the version for one unpinned request; the same sticky key always gets the
        same side of the split (crc32 bucket), so A/B comparisons stay clean."""
        if self.live_color:
            return self.live_version
        if self.candidate and self.candidate_weight > 0:
            if sticky_key is not None:
                bucket = zlib.crc32(sticky_key.encode()) % 100
            else:
                bucket = (rnd or random).randrange(100)
            if bucket < self.candidate_weight or not self.stable:
                return self.candidate
        return self.stable


@dataclass(frozen=True)
class DesiredState:
    """One route revision: all routes and all version specs they reference."""

    revision: int
    routes: dict[str, ModelRoute]
    versions: dict[tuple[str, str], VersionSpec]
    # Models that run here only as pipeline steps yet have an endpoint (keys, limits) serving
    # nothing of its own: that endpoint's route, so a call through the pipeline meets them.
    step_routes: dict[str, ModelRoute] = field(default_factory=dict)


@dataclass
class ObservedState:
    """What one replica actually runs, reported as its heartbeat."""

    replica: str
    revision: int
    # "model:version" -> {"state": READY|LOADING|FAILED|SCALED_TO_ZERO, "reason", "providers",
    # "queue_depth", "stats": VersionStats.snapshot(), "shadow": ShadowStats of a shadow version}
    versions: dict[str, dict] | None
    degraded: str | None = None
    # A heartbeat decoded from the wire may carry only what changed since the last one the
    # control plane acknowledged (versions None): the entries that changed or are new, and the
    # keys no longer there. Both empty: "same".
    changed: dict[str, dict] | None = None
    removed: tuple[str, ...] = ()


@runtime_checkable
class DesiredStateSource(Protocol):
    """Where a replica learns what to run (the registry) and reports what it runs.

    A source may also offer `fetch_artifact(spec) -> None` (not part of the protocol, so
    sources without one still are sources): put the version's artifact at `spec.artifact_path`
    (from an object store, into this host's cache) before it loads. Blocking (a loader thread).
    Raises LoadFailed (serving.core.reconciler) when the artifact is missing or wrong: that version
    fails; any other error (the store not answering) is tried again at the next poll."""

    def revision(self) -> int:
        """The newest route revision; cheap, called on every poll."""

    def fetch(self) -> DesiredState:
        """The full desired state at its newest revision, read consistently."""

    def report(self, observed: ObservedState) -> None:
        """Store this replica's heartbeat."""

    def subscribe(self, callback) -> None:
        """Call callback(revision) when a new revision is published (best effort)."""

    def request_load(self, model: str, authorization: str | None = None) -> None:
        """v2 repository extension: make `model` serve, as the caller whose Authorization
        header this is. Blocking (runs in a worker thread). Raises NotSupported where desired
        state is not changed this way, Unauthorized / Forbidden for the caller."""

    def request_unload(self, model: str, authorization: str | None = None) -> None:
        """v2 repository extension: stop serving `model`; raises as request_load does."""

    def authorize_operator(self, authorization: str | None, what: str) -> None:
        """Whether the caller whose Authorization header this is may change the replica's
        log or trace settings (`what` says which, for the refusal): returns, or raises
        Unauthorized / Forbidden. Blocking (runs in a worker thread). Optional: a source
        without it refuses every such change (serving.core.operator_settings)."""

    def leave(self, replica: str) -> None:
        """The replica stopped gracefully (its last call): forget it rather than report it
        lost. Blocking (runs in a worker thread); a failure is logged by the caller."""


def repository_action_not_offered(action: str, model: str) -> NotSupported:
    """The 501 for a load/unload this replica's source does not offer, saying where to go."""
    return NotSupported(
        f"{action} of model '{model}' is not offered by this replica: its models come "
        "from a model repository folder (edit the folder) or from the registry "
        "(use the console or its REST API)")


class ReadOnlySource:
    """Base for a DesiredStateSource whose desired state is edited elsewhere (a model
    repository folder): the v2 repository load/unload requests answer 501."""

    def request_load(self, model: str, authorization: str | None = None) -> None:
        raise repository_action_not_offered("load", model)

    def request_unload(self, model: str, authorization: str | None = None) -> None:
        raise repository_action_not_offered("unload", model)

    def authorize_operator(self, authorization: str | None, what: str) -> None:
        """A replica with no control plane behind it is standalone: whoever runs it operates
        it, so any caller that reaches it may change its log and trace settings (as Triton)."""

    def leave(self, replica: str) -> None:
        """Nothing to forget: a folder keeps no record of the replicas that read it."""
