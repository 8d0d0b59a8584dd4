"""Automated canary analysis: a plan (weight steps, bake time, guards) stored in the endpoint's
settings, and a periodic tick that reads per-version figures, then advances the weight, promotes
at the end, or rolls the candidate back by itself. Every decision that changes the endpoint goes
through the rollout services (actor "canary-analysis") and is audited with the figures it used.

The tick is a plain function (tests call it). Clustered mode runs it from Celery beat
(`registry.rollout_tick`); embedded mode from a scheduler thread in the console process."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from celery import shared_task
from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from .audit import Actor
from .errors import InvalidRequest, LifecycleError
from .models import Endpoint

log = logging.getLogger(__name__)
ACTOR = "canary-analysis"
DEFAULT_PLAN = {"steps": [5, 25, 50, 100], "bake_seconds": 60.0, "max_p99_ratio": 1.5,
                "min_p99_increase_ms": 1.0, "max_error_rate": 0.01, "min_requests": 100}
Metrics = Callable[[str, int, datetime], dict]


def clean_plan(raw: dict | None) -> dict:
    """The plan with defaults filled in; refuses what cannot make sense."""
    if not isinstance(raw, dict):
        raise InvalidRequest("plan must be an object", field="plan")
    unknown = set(raw) - set(DEFAULT_PLAN)
    if unknown:
        raise InvalidRequest(f"unknown plan field(s): {', '.join(sorted(unknown))}", field="plan")
    plan = {**DEFAULT_PLAN, **raw}
    steps = plan["steps"]
    if (not isinstance(steps, list) or not steps
            or not all(isinstance(s, int) and not isinstance(s, bool) and 1 <= s <= 100
                       for s in steps)
            or steps != sorted(set(steps))):
        raise InvalidRequest("plan.steps must be increasing whole percentages from 1 to 100",
                             field="plan")
    for key, low in (("bake_seconds", 0), ("max_p99_ratio", 1), ("min_p99_increase_ms", 0),
                     ("max_error_rate", 0), ("min_requests", 0)):
        value = plan[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or value < low:
            raise InvalidRequest(f"plan.{key} must be a number >= {low}", field="plan")
    plan["bake_seconds"] = float(plan["bake_seconds"])
    plan["min_p99_increase_ms"] = float(plan["min_p99_increase_ms"])
    plan["min_requests"] = int(plan["min_requests"])
    return plan


@dataclass
class Decision:
    action: str  # "wait" | "advance" | "promote" | "rollback"
    why: str
    figures: dict = field(default_factory=dict)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.2f} %"


def decide(plan: dict, step: int, *, candidate: dict, stable: dict, baked: bool,
           stable_since_start: dict | None = None) -> Decision:
    """Judge one step from the candidate's and stable's figures over the same window. The guards
    apply as soon as the candidate has min_requests; advancing also needs the bake time. When the
    stable has too few requests in the window (a 100 % step), its figures since the analysis
    started stand in for latency. A latency regression must be large in both senses: over
    max_p99_ratio x stable's p99 *and* more than min_p99_increase_ms above it, because on a
    shared host a sub-millisecond model's p99 is scheduler noise and a ratio of two noise figures
    would roll back healthy candidates."""
    # A plan stored before min_p99_increase_ms existed judges as it did then: no tolerance.
    slack = plan.get("min_p99_increase_ms", 0.0)
    figures = {"step": step, "weight": plan["steps"][step], "candidate": candidate,
               "stable": stable, "guards": {
                   "max_p99_ratio": plan["max_p99_ratio"], "min_p99_increase_ms": slack,
                   "max_error_rate": plan["max_error_rate"],
                   "min_requests": plan["min_requests"]}}
    need = plan["min_requests"]
    if candidate["count"] >= max(need, 1):
        rate = candidate.get("error_rate") or 0.0
        if rate > plan["max_error_rate"]:
            return Decision("rollback", f"candidate error rate {_pct(rate)} over "
                            f"{candidate['count']} requests > {_pct(plan['max_error_rate'])}",
                            figures)
        reference = stable
        if stable["count"] < max(need, 1) and stable_since_start is not None:
            reference = stable_since_start
            figures["stable_reference"] = {"window": "since analysis start", **reference}
        c99, s99 = candidate.get("p99_ms"), reference.get("p99_ms")
        comparable = reference["count"] >= max(need, 1) and c99 is not None and bool(s99)
        if comparable and c99 > plan["max_p99_ratio"] * s99 and c99 - s99 > slack:
            return Decision("rollback", f"candidate p99 {c99:.2f} ms > "
                            f"{plan['max_p99_ratio']} x stable p99 {s99:.2f} ms "
                            f"(+{c99 - s99:.2f} ms, tolerance {slack:g} ms)", figures)
        if baked and not comparable:
            return Decision("wait", f"only {reference['count']} stable requests to compare "
                            f"latency with; the plan needs {need}", figures)
    if not baked:
        return Decision("wait", "baking", figures)
    if candidate["count"] < need:
        return Decision("wait", f"only {candidate['count']} candidate requests at this step; "
                        f"the plan needs {need}", figures)
    last = step == len(plan["steps"]) - 1
    return Decision("promote" if last else "advance",
                    f"step {plan['steps'][step]} % healthy: error rate "
                    f"{_pct(candidate.get('error_rate'))}, p99 {candidate.get('p99_ms')} ms vs "
                    f"stable {stable.get('p99_ms')} ms", figures)


def _default_metrics() -> Metrics | None:
    try:
        from .metrics import version_window
    except ImportError:
        log.warning("registry.metrics is not available: canary analysis waits")
        return None
    return version_window


def tick(*, now: datetime | None = None, metrics: Metrics | None = None) -> list[dict]:
    """One pass: judge every running analysis, apply its decision, then the housekeeping."""
    from .services import rollouts

    now = now or timezone.now()
    metrics = metrics or _default_metrics()
    actor = Actor.system(ACTOR)
    out = []
    running = Endpoint.objects.filter(candidate__isnull=False).select_related(
        "model", "stable", "candidate")
    for ep in running if metrics is not None else ():
        analysis = (ep.settings or {}).get("analysis")
        if not analysis or analysis.get("paused"):
            continue
        name, plan, step = ep.model.name, analysis["plan"], analysis["step"]
        started = datetime.fromisoformat(analysis["step_started_at"])
        try:
            candidate = metrics(name, ep.candidate.number, started)
            stable = metrics(name, ep.stable.number, started)
            since_start = None
            if stable["count"] < max(plan["min_requests"], 1):
                first = analysis.get("started_at") or analysis["step_started_at"]
                since_start = metrics(name, ep.stable.number, datetime.fromisoformat(first))
        except Exception:  # figures unavailable: judge nothing rather than guess
            log.exception("canary analysis of %s: no figures", name)
            continue
        baked = (now - started).total_seconds() >= plan["bake_seconds"]
        d = decide(plan, step, candidate=candidate, stable=stable, baked=baked,
                   stable_since_start=since_start)
        out.append({"model": name, "action": d.action, "why": d.why, "figures": d.figures})
        try:
            if d.action == "advance":
                rollouts.analysis_advance(model_name=name, from_step=step, actor=actor,
                                          reason=d.why, details=d.figures)
            elif d.action == "promote":
                rollouts.canary_promote(model_name=name, actor=actor, reason=d.why,
                                        details=d.figures)
            elif d.action == "rollback":
                rollouts.canary_abort(model_name=name, actor=actor,
                                      reason=f"automatic rollback: {d.why}", details=d.figures)
        except LifecycleError as exc:  # changed by hand meanwhile: the refusal is audited
            out[-1]["refused"] = exc.message
    rollouts.housekeeping()
    return out


@shared_task(name="registry.rollout_tick", ignore_result=True)
def rollout_tick_task() -> int:
    return len(tick())


_scheduler: threading.Thread | None = None


def tick_seconds() -> float:
    configured = getattr(settings, "ROLLOUT_TICK_SECONDS", None)
    if configured is None:
        configured = os.environ.get("MMC_ROLLOUT_TICK_SECONDS", "5")
    return float(configured)


def start_scheduler(interval: float | None = None) -> threading.Thread | None:
    """Embedded mode: run tick() every `interval` seconds on a daemon thread (once per
    process). MMC_ROLLOUT_TICK_SECONDS=0 turns it off."""
    global _scheduler
    interval = tick_seconds() if interval is None else interval
    if interval <= 0 or _scheduler is not None:
        return _scheduler

    def loop() -> None:
        while True:
            time.sleep(interval)
            close_old_connections()
            try:
                tick()
            except Exception:
                log.exception("rollout tick failed")
            finally:
                close_old_connections()

    _scheduler = threading.Thread(target=loop, name="mmc-rollout-tick", daemon=True)
    _scheduler.start()
    return _scheduler
