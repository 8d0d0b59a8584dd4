"""Automated canary analysis: a plan (weight steps, bake time, guards; registry.routing) stored
in the endpoint's rollout state, and a periodic tick that reads per-version figures, then
advances the weight, promotes at the end, or rolls the candidate back by itself. Every decision
that changes the endpoint goes through the rollout services (actor "canary-analysis") and is
audited with the figures it used.

The tick is a plain function (tests call it); the periodic task `registry.rollout_tick`
(registry/tasks.py) runs it, and each pass records that it ran (analysis_watch drops running
candidates to 0 % when it stops: registry.ticks)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from django.utils import timezone

from registry.audit import Actor
from registry.errors import LifecycleError
from registry.metrics import version_window
from registry.models import Endpoint
from registry.monitoring.agreement import answers_check
from registry.routing import AnalysisPlan
from registry.services import rollouts
from registry.services.gate import refusal
from registry.ticks import tick_recorded

log = logging.getLogger(__name__)
ACTOR = "canary-analysis"
Metrics = Callable[[str, int, datetime], dict]


@dataclass
class Decision:
    action: str  # "wait" | "advance" | "promote" | "rollback" | "hold"
    why: str
    figures: dict = field(default_factory=dict)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.2f} %"


def decide(plan: AnalysisPlan, step: int, *, candidate: dict, stable: dict, baked: bool,
           stable_since_start: dict | None = None, answers: dict | None = None) -> Decision:
    """Judge one step from the candidate's and stable's figures over the same window. The guards
    apply as soon as the candidate has min_requests; advancing also needs the bake time. When the
    stable has too few requests in the window (a 100 % step), its figures since the analysis
    started stand in for latency. A latency regression must be large in both senses: over
    max_p99_ratio x stable's p99 *and* more than min_p99_increase_ms above it, because on a
    shared host a sub-millisecond model's p99 is scheduler noise and a ratio of two noise figures
    would roll back healthy candidates. `answers`: the agreement and quality checks'
    verdict (registry/monitoring/agreement.py answers_check), judged before latency."""
    slack = plan.min_p99_increase_ms
    figures = {"step": step, "weight": plan.steps[step], "candidate": candidate,
               "stable": stable, "guards": {
                   "max_p99_ratio": plan.max_p99_ratio, "min_p99_increase_ms": slack,
                   "max_error_rate": plan.max_error_rate, "min_requests": plan.min_requests}}
    if answers is not None:
        figures["answers"] = answers["figures"]
        if answers["why"]:
            return Decision("rollback", answers["why"], figures)
    need = plan.min_requests
    if candidate["count"] >= max(need, 1):
        rate = candidate.get("error_rate") or 0.0
        if rate > plan.max_error_rate:
            return Decision("rollback", f"candidate error rate {_pct(rate)} over "
                            f"{candidate['count']} requests > {_pct(plan.max_error_rate)}",
                            figures)
        reference = stable
        if stable["count"] < max(need, 1) and stable_since_start is not None:
            reference = stable_since_start
            figures["stable_reference"] = {"window": "since analysis start", **reference}
        c99, s99 = candidate.get("p99_ms"), reference.get("p99_ms")
        comparable = reference["count"] >= max(need, 1) and c99 is not None and bool(s99)
        if comparable and c99 > plan.max_p99_ratio * s99 and c99 - s99 > slack:
            return Decision("rollback", f"candidate p99 {c99:.2f} ms > "
                            f"{plan.max_p99_ratio} x stable p99 {s99:.2f} ms "
                            f"(+{c99 - s99:.2f} ms, tolerance {slack:g} ms)", figures)
        if baked and not comparable:
            return Decision("wait", f"only {reference['count']} stable requests to compare "
                            f"latency with; the plan needs {need}", figures)
    if not baked:
        return Decision("wait", "baking", figures)
    if candidate["count"] < need:
        return Decision("wait", f"only {candidate['count']} candidate requests at this step; "
                        f"the plan needs {need}", figures)
    if answers is not None and answers["waiting"]:
        return Decision("wait", answers["waiting"], figures)
    last = step == len(plan.steps) - 1
    return Decision("promote" if last else "advance",
                    f"step {plan.steps[step]} % healthy: error rate "
                    f"{_pct(candidate.get('error_rate'))}, p99 {candidate.get('p99_ms')} ms vs "
                    f"stable {stable.get('p99_ms')} ms", figures)


def tick(*, now: datetime | None = None, metrics: Metrics | None = None) -> list[dict]:
    """One pass: judge every running analysis, apply its decision, then the housekeeping."""
    now = now or timezone.now()
    metrics = metrics or version_window
    actor = Actor.system(ACTOR)
    out = []
    running = Endpoint.objects.filter(candidate__isnull=False).select_related(
        "model", "stable", "candidate")
    for ep in running:
        analysis = ep.rollout.analysis
        if not analysis or analysis.paused:
            continue
        name, plan, step = ep.model.name, analysis.plan, analysis.step
        started = analysis.step_started_at
        try:
            candidate = metrics(name, ep.candidate.number, started)
            stable = metrics(name, ep.stable.number, started)
            since_start = None
            if stable["count"] < max(plan.min_requests, 1):
                since_start = metrics(name, ep.stable.number, analysis.started_at)
            answers = (answers_check(plan, model=ep.model, candidate=ep.candidate,
                                     stable=ep.stable, since=analysis.started_at)
                       if plan.judges_answers else None)
        except Exception:  # figures unavailable: judge nothing rather than guess
            log.exception("canary analysis of %s: no figures", name)
            continue
        baked = (now - started).total_seconds() >= plan.bake_seconds
        d = decide(plan, step, candidate=candidate, stable=stable, baked=baked,
                   stable_since_start=since_start, answers=answers)
        if d.action in ("advance", "promote"):  # would the gate let it? Else hold, saying why
            ep.candidate.model = ep.model
            role = ("become stable" if d.action == "promote" else
                    f"take {plan.steps[step + 1]} % of traffic as the canary candidate")
            refused = refusal(ep.candidate, role=role)
            if refused is not None:
                d = Decision("hold", f"{refused.message}; the analysis holds at "
                             f"{plan.steps[step]} % until then", d.figures)
        out.append({"model": name, "action": d.action, "why": d.why, "figures": d.figures})
        try:
            if d.action == "advance":
                rollouts.analysis_advance(model_name=name, from_step=step, actor=actor,
                                          reason=d.why, details=d.figures)
            elif d.action == "promote":
                rollouts.canary_promote(model_name=name, actor=actor, reason=d.why,
                                        details=d.figures)
            elif d.action == "hold" and analysis.held != d.why:  # audited once, not per tick
                rollouts.analysis_hold(model_name=name, why=d.why, actor=actor,
                                       details=d.figures)
            elif d.action == "rollback":
                rollouts.canary_abort(model_name=name, actor=actor,
                                      reason=f"automatic rollback: {d.why}", details=d.figures)
        except LifecycleError as exc:  # changed by hand meanwhile: the refusal is audited
            out[-1]["refused"] = exc.message
    rollouts.housekeeping()
    tick_recorded()  # watched: a tick that stops is noticed (registry.ticks)
    return out

