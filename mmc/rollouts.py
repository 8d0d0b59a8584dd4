"""An endpoint and the ways its traffic changes: deploy, canary (by hand or analysed), rollback,
blue-green, shadow; protection, limits, scale to zero and predict keys.

Every change answers the endpoint. With `wait=` seconds (at most 120) the server holds the answer
until every live replica applied the change and says so in `endpoint.convergence`;
`endpoint.converged` is False when some did not in time. A change the endpoint's state forbids
raises Conflict naming the state."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mmc.resources import ApiKey, Endpoint, ShadowReport
from mmc.transport import Transport


def _endpoint(model: str, op: str = "") -> str:
    return f"models/{model}/endpoint/{op + '/' if op else ''}"


def _wait(wait: float | None) -> dict[str, float] | None:
    return {"wait": wait} if wait else None


class Rollouts(Transport):
    def _change(self, model: str, op: str, wait: float | None, body: Mapping[str, Any],
                method: str = "POST") -> Endpoint:
        return Endpoint.of(self._call(method, _endpoint(model, op), params=_wait(wait),
                                      json=dict(body), holds=wait))

    def get_endpoint(self, model: str) -> Endpoint:
        """Who takes traffic: stable, candidate and weight, blue/green, shadow, limits."""
        return Endpoint.of(self._call("GET", _endpoint(model)))

    def deploy(self, model: str, version: int | None, *, reason: str = "",
               wait: float | None = None) -> Endpoint:
        """Make a ready version the stable one (None: stop serving)."""
        return self._change(model, "deploy", wait, {"version": version, "reason": reason})

    def canary(self, model: str, version: int, *, weight: int = 0,
               plan: Mapping[str, Any] | None = None, override: bool = False,
               reason: str = "", wait: float | None = None) -> Endpoint:
        """Route `weight` % of traffic to a ready candidate; with `plan` ({"steps": [5, 25,
        100], "bake_seconds": 300, ...}) the server's analysis moves it on. `override` (admin,
        with a reason): start despite signature differences."""
        return self._change(model, "canary", wait, {
            "version": version, "weight": weight, "override": override, "reason": reason,
            **({"plan": dict(plan)} if plan is not None else {})})

    def set_weight(self, model: str, weight: int, *, reason: str = "",
                   wait: float | None = None) -> Endpoint:
        """The candidate's share of traffic, 0-100."""
        return self._change(model, "weight", wait, {"weight": weight, "reason": reason})

    def promote(self, model: str, *, reason: str = "", wait: float | None = None) -> Endpoint:
        """Make the candidate stable (the old stable stays warm for a rollback)."""
        return self._change(model, "promote", wait, {"reason": reason})

    def abort(self, model: str, *, reason: str = "", wait: float | None = None) -> Endpoint:
        """Drop the candidate."""
        return self._change(model, "abort", wait, {"reason": reason})

    def pause_analysis(self, model: str, *, reason: str = "",
                       wait: float | None = None) -> Endpoint:
        return self._change(model, "analysis/pause", wait, {"reason": reason})

    def resume_analysis(self, model: str, *, reason: str = "",
                        wait: float | None = None) -> Endpoint:
        return self._change(model, "analysis/resume", wait, {"reason": reason})

    def rollback(self, model: str, version: int, *, unload_first: bool = False,
                 reason: str = "", wait: float | None = None) -> Endpoint:
        """Point stable at an earlier ready version; `unload_first` frees memory first
        (unpinned requests get 503 in the gap)."""
        body: dict[str, Any] = {"version": version, "reason": reason}
        if unload_first:
            body["order"] = "unload-first"
        return self._change(model, "rollback", wait, body)

    def bluegreen_deploy(self, model: str, version: int, *, reason: str = "",
                         wait: float | None = None) -> Endpoint:
        """Load a version into the idle colour."""
        return self._change(model, "blue-green/deploy", wait,
                            {"version": version, "reason": reason})

    def switch(self, model: str, *, reason: str = "", wait: float | None = None) -> Endpoint:
        """Send all traffic to the idle colour."""
        return self._change(model, "blue-green/switch", wait, {"reason": reason})

    def switch_back(self, model: str, *, reason: str = "",
                    wait: float | None = None) -> Endpoint:
        return self._change(model, "blue-green/switch-back", wait, {"reason": reason})

    def bluegreen_finish(self, model: str, *, reason: str = "",
                         wait: float | None = None) -> Endpoint:
        """Leave blue-green: the idle colour is dropped."""
        return self._change(model, "blue-green/finish", wait, {"reason": reason})

    def start_shadow(self, model: str, version: int, *, reason: str = "",
                     wait: float | None = None) -> Endpoint:
        """Mirror live traffic to `version`; its answers are compared, never returned."""
        return self._change(model, "shadow", wait, {"version": version, "reason": reason})

    def stop_shadow(self, model: str, *, reason: str = "",
                    wait: float | None = None) -> Endpoint:
        return Endpoint.of(self._call("DELETE", _endpoint(model, "shadow"), holds=wait,
                                      params={**(_wait(wait) or {}), "reason": reason}))

    def get_shadow(self, model: str) -> ShadowReport:
        """The shadow version and the newest shadow-vs-live comparison a replica reported."""
        return ShadowReport.of(self._call("GET", _endpoint(model, "shadow")))

    # -- who may call it, and how much -----------------------------------------------------

    def protect_endpoint(self, model: str, *, reason: str = "",
                         wait: float | None = None) -> Endpoint:
        """Every /infer call needs one of the endpoint's predict keys."""
        return self._change(model, "protect", wait, {"reason": reason})

    def open_endpoint(self, model: str, *, reason: str = "",
                      wait: float | None = None) -> Endpoint:
        """/infer without a predict key again."""
        return self._change(model, "open", wait, {"reason": reason})

    def set_limits(self, model: str, *, rps: float | None = None, burst: int | None = None,
                   daily_quota: int | None = None, reason: str = "",
                   wait: float | None = None) -> Endpoint:
        """Rate limit (per replica) and daily quota (cluster-wide); left out: unchanged; 0:
        none."""
        body = {k: v for k, v in (("rps", rps), ("burst", burst),
                                  ("daily_quota", daily_quota)) if v is not None}
        return self._change(model, "limits", wait, {**body, "reason": reason}, method="PUT")

    def set_scale_to_zero(self, model: str, after_seconds: int, *, reason: str = "",
                          wait: float | None = None) -> Endpoint:
        """Unload the endpoint's versions after this many idle seconds (0: never)."""
        return self._change(model, "scale-to-zero", wait,
                            {"after_seconds": after_seconds, "reason": reason}, method="PUT")

    def list_api_keys(self, model: str) -> list[ApiKey]:
        return [ApiKey.of(k) for k in self._call("GET", _endpoint(model, "keys"))]

    def create_api_key(self, model: str, name: str) -> ApiKey:
        """A predict key (its secret in `key`, shown once); the endpoint becomes protected."""
        return ApiKey.of(self._call("POST", _endpoint(model, "keys"), json={"name": name}))

    def revoke_api_key(self, model: str, prefix: str) -> ApiKey:
        """Revoke a key; the answer says how many remain and whether every call is refused."""
        return ApiKey.of(self._call("DELETE", _endpoint(model, f"keys/{prefix}")))
