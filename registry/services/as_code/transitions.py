"""From the routing an endpoint has to the routing mmc.yaml declares: the state machine's own
operations, in an order it accepts (registry/services/deployments.py). An apply runs these steps
through the same services the console and the API call, so every rule and refusal is theirs.

Pure: no database. `Route` is an endpoint's routing in the file's terms (version numbers);
`route_steps` simulates each operation on it to choose the next one."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from registry.routing import ANALYSING, BLUE_GREEN, CANARY, EMPTY, STABLE


@dataclass(frozen=True)
class Route:
    """What an endpoint routes, by version number. `paused` (a paused analysis' plan),
    `switched` (the idle slot holds the version just switched away from) and an unload-first
    rollback's target (`stable` while UNLOADING) are only ever read from the registry."""

    state: str = EMPTY
    stable: int | None = None
    candidate: int | None = None
    weight: int = 0
    analysis: dict | None = None
    paused: dict | None = None
    live: int | None = None
    idle: int | None = None
    switched: bool = False
    shadow: int | None = None

    @classmethod
    def from_file(cls, endpoint: dict) -> Route | None:
        """The routing an endpoint section declares (references already resolved to numbers),
        or None when it declares none (no `stable`, no `blue_green`)."""
        shadow = endpoint.get("shadow")
        if "blue_green" in endpoint:
            bg = endpoint["blue_green"]
            return cls(state=BLUE_GREEN, live=bg["live"], idle=bg["idle"], shadow=shadow)
        if "stable" not in endpoint:
            return None
        if endpoint["stable"] is None:
            return cls()
        if endpoint.get("candidate") is None:
            return cls(state=STABLE, stable=endpoint["stable"], shadow=shadow)
        analysis = endpoint.get("analysis")
        return cls(state=ANALYSING if analysis is not None else CANARY,
                   stable=endpoint["stable"], candidate=endpoint["candidate"],
                   weight=0 if analysis is not None else endpoint.get("weight", 0),
                   analysis=analysis, shadow=shadow)

    def as_file(self) -> dict[str, Any]:
        """The routing keys of an endpoint section, as the export writes them."""
        if self.state == BLUE_GREEN:
            out: dict[str, Any] = {"blue_green": {"live": self.live, "idle": self.idle}}
        else:
            out = {"stable": self.stable}
            if self.candidate is not None:
                if self.state == ANALYSING:
                    out.update(candidate=self.candidate, analysis=self.analysis)
                else:
                    out.update(candidate=self.candidate, weight=self.weight)
        if self.shadow is not None:
            out["shadow"] = self.shadow
        return out

    def satisfies(self, wanted: Route) -> bool:
        """Whether this (the registry's) routing is what `wanted` declares. A canary under an
        analysis that has since promoted its candidate is done: the file is not replayed."""
        if (wanted.state == ANALYSING and self.state == STABLE
                and self.stable == wanted.candidate and self.shadow == wanted.shadow):
            return True
        return self.as_file() == wanted.as_file()


@dataclass(frozen=True)
class Step:
    """One operation of the state machine: the service (by name in registry.services), its
    arguments besides model_name, actor and reason, and what it does in words."""

    service: str
    args: dict
    text: str


def route_steps(current: Route, wanted: Route) -> list[Step]:
    """The operations that take `current` to `wanted`, in order; none when it satisfies it.
    An endpoint in a state that forbids an operation (an unload-first rollback under way) is
    given it anyway: the state machine refuses it, in its own words."""
    if current.satisfies(wanted):
        return []
    steps: list[Step] = []
    route = current
    if replace(route, shadow=None).as_file() != replace(wanted, shadow=None).as_file():
        route = _traffic(route, wanted, steps)
    if route.shadow != wanted.shadow:
        if wanted.shadow is None:
            steps.append(Step("shadow_stop", {}, f"stop the shadow (version {route.shadow})"))
        else:
            steps.append(Step("shadow_start", {"version_number": wanted.shadow},
                              f"shadow version {wanted.shadow}"))
    return steps


def _traffic(route: Route, wanted: Route, steps: list[Step]) -> Route:
    """Append the steps that route traffic as `wanted` does (the shadow aside); return the
    routing they leave."""

    def step(service: str, text: str, **args) -> None:
        steps.append(Step(service, args, text))

    same_canary = (wanted.state in (CANARY, ANALYSING) and route.stable == wanted.stable
                   and route.candidate == wanted.candidate)
    # Out of a canary the file no longer has: its candidate is promoted when the file makes it
    # the live version, else the canary is aborted.
    if route.state in (CANARY, ANALYSING) and not same_canary:
        goes_live = wanted.live if wanted.state == BLUE_GREEN else wanted.stable
        if route.candidate is not None and route.candidate == goes_live:
            step("canary_promote", f"promote the candidate (version {route.candidate})")
            route = Route(state=STABLE, stable=route.candidate, shadow=route.shadow)
        else:
            step("canary_abort", f"abort the canary of version {route.candidate}")
            route = Route(state=STABLE, stable=route.stable, shadow=route.shadow)
    # Out of blue-green: to the idle slot first when the file makes it the stable.
    if route.state == BLUE_GREEN and wanted.state != BLUE_GREEN:
        if wanted.stable is not None and wanted.stable == route.idle:
            route = _switch(route, steps)
        step("bluegreen_finish", f"finish blue-green (version {route.live} stays)")
        route = Route(state=STABLE, stable=route.live, shadow=route.shadow)

    if wanted.state == EMPTY:
        if route.state != EMPTY:
            step("endpoint_deploy", "stop serving (undeploy)", version_number=None)
        return Route()
    if wanted.state == STABLE:
        return _stable(route, wanted.stable, steps)
    if wanted.state in (CANARY, ANALYSING):
        return _canary(route, wanted, steps)
    return _blue_green(route, wanted, steps)


def _stable(route: Route, number: int, steps: list[Step]) -> Route:
    """Deploy `number` unless it is the plain stable already (from empty, stable, or an
    unload-first rollback, which the state machine refuses until it is done)."""
    if route.state != STABLE or route.stable != number:
        steps.append(Step("endpoint_deploy", {"version_number": number},
                          f"deploy version {number} as the stable"))
    return replace(route, state=STABLE, stable=number)


def _start_canary(route: Route, wanted: Route, steps: list[Step]) -> Route:
    if wanted.analysis is not None:
        steps.append(Step("canary_start", {"version_number": wanted.candidate,
                                           "plan": wanted.analysis},
                          f"start a canary of version {wanted.candidate} under analysis"))
    else:
        steps.append(Step("canary_start", {"version_number": wanted.candidate,
                                           "weight": wanted.weight},
                          f"start a canary of version {wanted.candidate} at {wanted.weight} %"))
    return replace(wanted, shadow=route.shadow)


def _canary(route: Route, wanted: Route, steps: list[Step]) -> Route:
    if route.state not in (CANARY, ANALYSING):
        route = _stable(route, wanted.stable, steps)
        return _start_canary(route, wanted, steps)
    # the same stable and candidate: only how the weight is set differs
    if wanted.analysis is None:
        if route.state == ANALYSING:
            steps.append(Step("analysis_pause", {}, "pause the analysis (weights by hand)"))
            route = replace(route, state=CANARY, paused=route.analysis, analysis=None)
        if route.weight != wanted.weight:
            steps.append(Step("canary_weight", {"weight": wanted.weight},
                              f"set the candidate's weight to {wanted.weight} %"))
        return replace(route, weight=wanted.weight)
    if route.state == CANARY and route.paused == wanted.analysis:
        steps.append(Step("analysis_resume", {}, "resume the analysis"))
        return replace(route, state=ANALYSING, analysis=route.paused, paused=None)
    steps.append(Step("canary_abort", {}, f"abort the canary of version {route.candidate} (its "
                                          f"analysis changes)"))
    return _start_canary(Route(state=STABLE, stable=route.stable, shadow=route.shadow), wanted,
                         steps)


def _switch(route: Route, steps: list[Step]) -> Route:
    if route.switched:
        steps.append(Step("bluegreen_switch_back", {}, f"switch back to version {route.idle}"))
    else:
        steps.append(Step("bluegreen_switch", {}, f"switch traffic to version {route.idle}"))
    return replace(route, live=route.idle, idle=route.live, switched=not route.switched)


def _fill_idle(route: Route, number: int, steps: list[Step]) -> Route:
    steps.append(Step("bluegreen_deploy", {"version_number": number},
                      f"load version {number} into the idle slot"))
    if route.state != BLUE_GREEN:
        return Route(state=BLUE_GREEN, live=route.stable, idle=number, shadow=route.shadow)
    return replace(route, idle=number, switched=False)


def _blue_green(route: Route, wanted: Route, steps: list[Step]) -> Route:
    if route.state != BLUE_GREEN:
        if route.state == STABLE and route.stable == wanted.idle:
            return _switch(_fill_idle(route, wanted.live, steps), steps)
        route = _stable(route, wanted.live, steps)
        return _fill_idle(route, wanted.idle, steps)
    if route.live != wanted.live:
        if route.idle != wanted.live:
            route = _fill_idle(route, wanted.live, steps)
        route = _switch(route, steps)
    if route.idle != wanted.idle:
        route = _fill_idle(route, wanted.idle, steps)
    return route
