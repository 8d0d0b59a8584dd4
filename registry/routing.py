"""An endpoint's routing state as one typed value.

`Routing` is read from an `Endpoint` (its version columns and its `rollout_state`) and answers
what every floor used to re-derive: the state the endpoint is in, the live and idle versions, the
traffic split, the versions a replica must load, and (`entrances`) which versions a change gives
traffic they did not have: what the one gate where routing changes checks
(registry/services/gate.py). Services mutate the endpoint through the typed `RolloutState`
(automated analysis, blue-green, a pending unload-first rollback); the console, webhooks, API
serializers and the serving source only read.

Pure: no database, no Django; version references are whatever the caller holds (ids, numbers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Generic, TypeVar

from registry.errors import InvalidRequest

V = TypeVar("V")
W = TypeVar("W")

# Endpoint states, derived from its fields (never stored, so they cannot disagree with them).
EMPTY = "empty"            # serves nothing
STABLE = "stable"          # one stable version takes all traffic
CANARY = "canary"          # a candidate takes candidate_weight %, weights set by hand
ANALYSING = "analysing"    # a canary whose weights the automated analysis drives
BLUE_GREEN = "blue-green"  # live_color's slot takes all traffic, the other slot is idle
UNLOADING = "unloading"    # an unload-first rollback between its two revisions
STATES = (EMPTY, STABLE, CANARY, ANALYSING, BLUE_GREEN, UNLOADING)
COLORS = ("blue", "green")


def other_color(color: str) -> str:
    return "green" if color == "blue" else "blue"


# ------------------------------------------------------------------------------ rollout state


@dataclass(frozen=True)
class AnalysisPlan:
    """Automated canary analysis: weight steps, bake time per step, and the guards."""

    steps: tuple[int, ...] = (5, 25, 50, 100)
    bake_seconds: float = 60.0
    max_p99_ratio: float = 1.5
    min_p99_increase_ms: float = 1.0
    max_error_rate: float = 0.01
    min_requests: int = 100
    # Judged by its answers (registry/monitoring/agreement.py), each check off while None: a
    # mirrored share of the stable's requests also runs on the candidate (never returned), and
    # the two answers are compared once `min_compared` rows were; feedback joined in time
    # compares their quality once each has `min_feedback` labels.
    mirror_percent: int = 0
    min_compared: int = 50
    min_agreement: float | None = None             # classifiers: share of equal argmax
    max_abs_diff: float | None = None              # regressors: largest |candidate - stable|
    max_mean_abs_diff: float | None = None
    max_distribution_distance: float | None = None  # Jensen-Shannon distance, 0..1
    max_quality_drop: float | None = None          # stable's metric - candidate's (worse side)
    min_feedback: int = 30

    # (key, lowest, highest) of the optional answer checks; None: no upper bound
    ANSWER_CHECKS = (("min_agreement", 0, 1), ("max_abs_diff", 0, None),
                     ("max_mean_abs_diff", 0, None), ("max_distribution_distance", 0, 1),
                     ("max_quality_drop", 0, None))

    @classmethod
    def clean(cls, raw: object) -> AnalysisPlan:
        """A plan from what a user sent, defaults filled in; refuses what cannot make sense."""
        if not isinstance(raw, dict):
            raise InvalidRequest("plan must be an object", field="plan")
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(raw) - known
        if unknown:
            raise InvalidRequest(f"unknown plan field(s): {', '.join(sorted(unknown))}",
                                 field="plan")
        steps = raw.get("steps", list(cls.steps))
        if (not isinstance(steps, list) or not steps
                or not all(isinstance(s, int) and not isinstance(s, bool) and 1 <= s <= 100
                           for s in steps)
                or steps != sorted(set(steps))):
            raise InvalidRequest("plan.steps must be increasing whole percentages from 1 to 100",
                                 field="plan")
        values = {}
        for key, low in (("bake_seconds", 0), ("max_p99_ratio", 1), ("min_p99_increase_ms", 0),
                         ("max_error_rate", 0), ("min_requests", 0)):
            value = raw.get(key, getattr(cls, key))
            if isinstance(value, bool) or not isinstance(value, int | float) or value < low:
                raise InvalidRequest(f"plan.{key} must be a number >= {low}", field="plan")
            values[key] = value
        answers = cls._clean_answer_checks(raw)
        return cls(steps=tuple(steps), bake_seconds=float(values["bake_seconds"]),
                   max_p99_ratio=values["max_p99_ratio"],
                   min_p99_increase_ms=float(values["min_p99_increase_ms"]),
                   max_error_rate=values["max_error_rate"],
                   min_requests=int(values["min_requests"]), **answers)

    @classmethod
    def _clean_answer_checks(cls, raw: dict) -> dict:
        """The agreement and quality fields, each refused with its own name."""
        out: dict = {}
        for key, low, high in (("mirror_percent", 0, 100), ("min_compared", 0, None),
                               ("min_feedback", 1, None)):
            value = raw.get(key, getattr(cls, key))
            if (isinstance(value, bool) or not isinstance(value, int) or value < low
                    or (high is not None and value > high)):
                span = f"from {low} to {high}" if high is not None else f">= {low}"
                raise InvalidRequest(f"plan.{key} must be a whole number {span}",
                                     field=f"plan.{key}")
            out[key] = value
        for key, low, high in cls.ANSWER_CHECKS:
            value = raw.get(key)
            if value is None:
                out[key] = None
                continue
            if (isinstance(value, bool) or not isinstance(value, int | float) or value < low
                    or (high is not None and value > high)):
                span = f"from {low} to {high}" if high is not None else f">= {low}"
                raise InvalidRequest(f"plan.{key} must be a number {span} (or null: not "
                                     f"checked)", field=f"plan.{key}")
            out[key] = float(value)
        agreement = any(out[k] is not None for k in ("min_agreement", "max_abs_diff",
                                                     "max_mean_abs_diff",
                                                     "max_distribution_distance"))
        if agreement and not out["mirror_percent"]:
            raise InvalidRequest("plan.mirror_percent must be 1-100 when an agreement check "
                                 "(min_agreement, max_abs_diff, max_mean_abs_diff, "
                                 "max_distribution_distance) is set: the candidate answers "
                                 "only what is mirrored to it", field="plan.mirror_percent")
        return out

    @property
    def judges_answers(self) -> bool:
        return any(getattr(self, key) is not None for key, _, _ in self.ANSWER_CHECKS)

    def as_dict(self) -> dict:
        """The plan as JSON; the answer checks only where set (a plan without them reads, is
        stored and exported as before they existed)."""
        out = {**asdict(self), "steps": list(self.steps)}
        for key in ("mirror_percent", "min_compared", "min_feedback",
                    *(k for k, _, _ in self.ANSWER_CHECKS)):
            if out[key] == getattr(AnalysisPlan, key):
                del out[key]
        return out


def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _stamp(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


@dataclass(frozen=True)
class Analysis:
    """A running (or paused) automated canary analysis."""

    plan: AnalysisPlan
    step: int
    started_at: datetime
    step_started_at: datetime
    paused: bool = False
    # Why it holds at its last step instead of promoting (the candidate awaits approval).
    held: str = ""

    @property
    def weight(self) -> int:
        return self.plan.steps[self.step]

    @classmethod
    def from_json(cls, data: dict) -> Analysis:
        return cls(plan=AnalysisPlan(**{**data["plan"], "steps": tuple(data["plan"]["steps"])}),
                   step=data["step"], paused=bool(data.get("paused")),
                   held=data.get("held") or "",
                   started_at=_time(data.get("started_at") or data["step_started_at"]),
                   step_started_at=_time(data["step_started_at"]))

    def to_json(self) -> dict:
        return {"plan": self.plan.as_dict(), "step": self.step, "paused": self.paused,
                "started_at": _stamp(self.started_at),
                "step_started_at": _stamp(self.step_started_at),
                **({"held": self.held} if self.held else {})}


@dataclass(frozen=True)
class BlueGreen:
    """A blue-green rollout: when the idle colour was filled, and the last switch."""

    deployed_at: datetime
    switched_at: datetime | None = None      # set while the idle colour holds the old live
    switched_from: str | None = None
    switched_back_at: datetime | None = None

    @classmethod
    def from_json(cls, data: dict) -> BlueGreen:
        return cls(deployed_at=_time(data["deployed_at"]),
                   switched_at=_time(data.get("switched_at")), switched_from=data.get("from"),
                   switched_back_at=_time(data.get("switched_back_at")))

    def to_json(self) -> dict:
        out = {"deployed_at": _stamp(self.deployed_at), "switched_at": _stamp(self.switched_at)}
        if self.switched_from:
            out["from"] = self.switched_from
        if self.switched_back_at:
            out["switched_back_at"] = _stamp(self.switched_back_at)
        return out


@dataclass(frozen=True)
class PendingRollback:
    """The second half of an unload-first rollback: load this version once the old is gone."""

    version: int
    since: datetime

    @classmethod
    def from_json(cls, data: dict) -> PendingRollback:
        return cls(version=int(data["version"]), since=_time(data["since"]))

    def to_json(self) -> dict:
        return {"version": self.version, "since": _stamp(self.since)}


@dataclass(frozen=True)
class RolloutState:
    """What an endpoint's rollout remembers beyond its version columns (stored as JSON in
    `Endpoint.rollout_state`)."""

    analysis: Analysis | None = None
    blue_green: BlueGreen | None = None
    pending_rollback: PendingRollback | None = None

    @classmethod
    def from_json(cls, data: dict | None) -> RolloutState:
        data = data or {}
        return cls(
            analysis=Analysis.from_json(data["analysis"]) if data.get("analysis") else None,
            blue_green=(BlueGreen.from_json(data["blue_green"]) if data.get("blue_green")
                        else None),
            pending_rollback=(PendingRollback.from_json(data["pending_rollback"])
                              if data.get("pending_rollback") else None))

    def to_json(self) -> dict:
        return {name: part.to_json() for name, part in (
            ("analysis", self.analysis), ("blue_green", self.blue_green),
            ("pending_rollback", self.pending_rollback)) if part is not None}

    def with_(self, **parts) -> RolloutState:
        return replace(self, **parts)


# ------------------------------------------------------------------------------------ routing


@dataclass(frozen=True)
class Routing(Generic[V]):
    """Which versions of one model take which traffic. `V` is how versions are referred to:
    database ids when read from an endpoint, numbers or names once mapped."""

    stable: V | None = None
    candidate: V | None = None
    candidate_weight: int = 0
    blue: V | None = None
    green: V | None = None
    live_color: str = ""
    shadow: V | None = None
    warm: tuple[V, ...] = ()          # kept loaded without traffic (grace period)
    rollout: RolloutState = field(default_factory=RolloutState)

    @classmethod
    def of(cls, ep, *, now: datetime | None = None) -> Routing[int]:
        """Read from an Endpoint row (ids; warm versions only while their grace lasts when
        `now` is given)."""
        warm = tuple(ep.warm_versions or ())
        if now is not None and not (ep.warm_until and ep.warm_until > now):
            warm = ()
        return cls(stable=ep.stable_id, candidate=ep.candidate_id,
                   candidate_weight=ep.candidate_weight if ep.candidate_id else 0,
                   blue=ep.blue_id, green=ep.green_id, live_color=ep.live_color or "",
                   shadow=ep.shadow_id, warm=warm,
                   rollout=RolloutState.from_json(ep.rollout_state))

    def map(self, fn: Callable[[V], W | None]) -> Routing[W]:
        """The same routing with every version reference passed through `fn` (None drops it)."""
        def one(v):
            return None if v is None else fn(v)

        return Routing(stable=one(self.stable), candidate=one(self.candidate),
                       candidate_weight=self.candidate_weight, blue=one(self.blue),
                       green=one(self.green), live_color=self.live_color,
                       shadow=one(self.shadow),
                       warm=tuple(w for w in map(one, self.warm) if w is not None),
                       rollout=self.rollout)

    @property
    def state(self) -> str:
        if self.live_color:
            return BLUE_GREEN
        if self.candidate is not None:
            analysis = self.rollout.analysis
            return ANALYSING if analysis and not analysis.paused else CANARY
        if self.stable is not None:
            return STABLE
        if self.rollout.pending_rollback:
            return UNLOADING
        return EMPTY

    @property
    def idle_color(self) -> str:
        """The blue-green slot without traffic ("" outside blue-green)."""
        return other_color(self.live_color) if self.live_color else ""

    @property
    def live(self) -> V | None:
        """The version that takes unpinned traffic by default: the live slot in blue-green,
        else the stable."""
        if self.live_color:
            return self.blue if self.live_color == "blue" else self.green
        return self.stable

    @property
    def idle(self) -> V | None:
        """Blue-green's loaded version without traffic (None outside blue-green)."""
        if not self.live_color:
            return None
        return self.green if self.live_color == "blue" else self.blue

    def split(self) -> list[tuple[str, V, int]]:
        """(role, version, percent of unpinned traffic): the live colour alone in blue-green,
        else the stable and the candidate (a 0 % side included: it is still routed)."""
        if self.live_color:
            return [(self.live_color, self.live, 100)] if self.live is not None else []
        out = []
        if self.stable is not None:
            out.append(("stable", self.stable, 100 - self.candidate_weight))
        if self.candidate is not None:
            out.append(("candidate", self.candidate, self.candidate_weight))
        return out

    def roles(self) -> list[tuple[str, V, int]]:
        """(role, version, percent of unpinned traffic), one per routed version: the split
        first, then blue-green's idle slot and the shadow at 0 %. A version in two roles keeps
        the first, so a (version, role) pair names a version once (what a monitoring join on
        the version needs)."""
        pairs = [*self.split()]
        if self.idle is not None:
            pairs.append((self.idle_color, self.idle, 0))
        if self.shadow is not None:
            pairs.append(("shadow", self.shadow, 0))
        seen: set[V] = set()
        out = []
        for role, version, percent in pairs:
            if version not in seen:
                seen.add(version)
                out.append((role, version, percent))
        return out

    def serving_versions(self) -> set[V]:
        """Versions that answer unpinned traffic right now."""
        return {v for _, v, weight in self.split() if weight > 0}

    def referenced(self) -> set[V]:
        """Every version a replica must keep loaded for this routing."""
        vs = {self.stable, self.candidate, self.blue, self.green, self.shadow, *self.warm}
        vs.discard(None)
        return vs

    def entrances(self, before: Routing[V]) -> list[tuple[V, str]]:
        """(version, role) for each version this routing gives traffic it did not have in
        `before`: the live role (stable, or the live slot), a candidate or more weight for it,
        the idle slot, the shadow. The role is worded for "it cannot ...". Taking traffic away
        (abort, undeploy, rollback's old stable, a switch's old live going idle) enters
        nothing, so it is never refused."""
        out: list[tuple[V, str]] = []
        if self.live is not None and self.live != before.live:
            out.append((self.live, f"go live in the {self.live_color} slot" if self.live_color
                        else "become stable"))
        if self.candidate is not None:
            if self.candidate != before.candidate:
                out.append((self.candidate,
                            f"become the canary candidate ({self.candidate_weight} %)"))
            elif self.candidate_weight > before.candidate_weight:
                out.append((self.candidate, f"take {self.candidate_weight} % of traffic as the "
                                            f"canary candidate"))
        if self.idle is not None and self.idle not in (before.idle, before.live):
            out.append((self.idle, f"fill the idle {self.idle_color} slot"))
        if self.shadow is not None and self.shadow != before.shadow:
            out.append((self.shadow, "shadow live traffic"))
        return out
