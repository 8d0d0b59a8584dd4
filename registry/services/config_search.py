"""Serving-config search: what Triton's Model Analyzer does offline, done where versions live. A
bounded grid over a version's batching, queue delay, instances, threads and response cache; each
point is applied to the version itself through `version_configure` (audited; the replicas
reload it), measured with the load test's generator on one replica, and the version's own
settings are put back at the end (registry.services.config_sweep runs it). The version is the
trial: one that takes real traffic is refused unless confirmed, as a load test is. The best
point (most req/s with p99 within the budget and no errors) can then be applied with one call.

This module holds the grid, the choosing rule, and starting, cancelling and applying a search."""

from __future__ import annotations

import math
from itertools import product

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from registry import selectors
from registry.audit import Actor, record
from registry.background import enqueue
from registry.errors import InvalidRequest, LifecycleError, NotFound
from registry.models import ConfigSearch, Job, JobKind, JobStatus, ModelVersion
from registry.notify import bump_revision
from registry.services.loadtests import (
    ACTIVE,
    live_traffic_roles,
    require_key_if_protected,
    target_replica,
)
from registry.services.versions import CONFIG_FIELDS, FLAG_FIELDS, version_configure
from serving.core.tensor_signature import batch_dimension
from serving.process.replica_address import replica_url

#: The settings a search varies, in the order a point names them.
DIMENSIONS = ("max_batch_size", "max_queue_delay_us", "instance_count", "intra_op_threads",
              "response_cache")
MAX_VALUES = 6          # values per dimension
MAX_POINTS = 24         # the grid's cross product
MAX_SECONDS = 600       # points × seconds per point: the measuring a search may take
MAX_P99_BUDGET_MS = 60_000.0


def settings_of(version: ModelVersion) -> dict:
    return {name: getattr(version, name) for name in DIMENSIONS}


# -- the grid ----------------------------------------------------------------------------------


def _bounds(*, concurrency: int, seconds: int, p99_budget_ms: float) -> None:
    if not 1 <= concurrency <= settings.LOADTEST_MAX_CONCURRENCY:
        raise InvalidRequest(f"concurrency must be from 1 to "
                             f"{settings.LOADTEST_MAX_CONCURRENCY} (MMC_LOADTEST_MAX_CONCURRENCY)",
                             field="concurrency")
    if not 1 <= seconds <= settings.LOADTEST_MAX_SECONDS:
        raise InvalidRequest(f"seconds (per point) must be from 1 to "
                             f"{settings.LOADTEST_MAX_SECONDS} (MMC_LOADTEST_MAX_SECONDS)",
                             field="seconds")
    if not (isinstance(p99_budget_ms, int | float) and math.isfinite(p99_budget_ms)
            and 0 < p99_budget_ms <= MAX_P99_BUDGET_MS):
        raise InvalidRequest(f"p99_budget_ms must be a number of milliseconds above 0 and at "
                             f"most {MAX_P99_BUDGET_MS:.0f}", field="p99_budget_ms")


def _clean_values(name: str, values, version: ModelVersion) -> list:
    field = f"grid.{name}"
    if not isinstance(values, list) or not values:
        raise InvalidRequest(f"{field} must be a non-empty list of values to try", field=field)
    if len(values) > MAX_VALUES:
        raise InvalidRequest(f"{field} has {len(values)} values: at most {MAX_VALUES} per "
                             f"setting", field=field)
    if name in FLAG_FIELDS:
        if not all(isinstance(v, bool) for v in values):
            raise InvalidRequest(f"{field} takes true and/or false", field=field)
    else:
        _, low, high = CONFIG_FIELDS[name]
        if not all(isinstance(v, int) and not isinstance(v, bool) and low <= v <= high
                   for v in values):
            raise InvalidRequest(f"{field} takes integers from {low} to {high}", field=field)
    if len(set(values)) != len(values):
        raise InvalidRequest(f"{field} repeats a value", field=field)
    if name == "max_batch_size" and any(values) and not batch_dimension(version.signature or {}):
        raise InvalidRequest(f"{field}: a value above 0 needs a dynamic first dimension on "
                             f"every input, which v{version.number} lacks", field=field)
    return values


def clean_grid(grid, version: ModelVersion) -> dict[str, list]:
    """The grid in DIMENSIONS order, every value checked against the version's settings' own
    ranges, and its cross product within MAX_POINTS."""
    if not isinstance(grid, dict) or not grid:
        raise InvalidRequest("grid must name at least one setting with the values to try, e.g. "
                             '{"max_batch_size": [0, 8], "instance_count": [1, 2]}', field="grid")
    unknown = sorted(set(grid) - set(DIMENSIONS))
    if unknown:
        raise InvalidRequest(f"grid.{unknown[0]} cannot be searched; the settings that can: "
                             f"{', '.join(DIMENSIONS)}", field=f"grid.{unknown[0]}")
    clean = {name: _clean_values(name, grid[name], version) for name in DIMENSIONS
             if name in grid}
    count = math.prod(len(v) for v in clean.values())
    if count > MAX_POINTS:
        sizes = " × ".join(str(len(v)) for v in clean.values())
        raise InvalidRequest(f"the grid has {count} points ({sizes}): at most {MAX_POINTS}; "
                             f"try fewer values", field="grid")
    return clean


def grid_points(grid: dict[str, list], original: dict) -> list[dict]:
    """Every point of the grid as full settings (what is not searched keeps its value)."""
    names = [n for n in DIMENSIONS if n in grid]
    return [{**original, **dict(zip(names, values, strict=True))}
            for values in product(*(grid[n] for n in names))]


def choose_best(points: list[dict], p99_budget_ms: float) -> int | None:
    """The point with the most req/s among those measured with no errors and a p99 within the
    budget (the earlier one on a tie); None when none qualifies."""
    fitting = [(p["rps"], -i) for i, p in enumerate(points)
               if not p.get("failure") and p.get("rps") is not None
               and p.get("p99_ms") is not None and p["p99_ms"] <= p99_budget_ms
               and not p.get("errors")]
    return -max(fitting)[1] if fitting else None


# -- starting, cancelling, applying -------------------------------------------------------------


def _active_search(version: ModelVersion) -> ConfigSearch | None:
    return version.config_searches.filter(status__in=ACTIVE).first()


def config_search_create(*, model_name: str, number: int, actor: Actor, grid,
                         concurrency: int = 4, seconds: int = 5, p99_budget_ms: float = 100.0,
                         replica: str = "", confirm: bool = False, key: str = "") -> ConfigSearch:
    """Queue a search of version `number`'s serving settings. Bounded: at most MAX_POINTS
    points and MAX_SECONDS of measuring; a version taking real traffic is refused unless
    `confirm` (its users get every trial setting); a protected endpoint's key only travels in
    the task's arguments."""
    _bounds(concurrency=concurrency, seconds=seconds, p99_budget_ms=p99_budget_ms)
    model = selectors.model_get(model_name)
    version = selectors.ready_version(model, number)
    if version.pipeline is not None:
        raise LifecycleError(f"{model_name}:{number} is a pipeline: its batching and threads are "
                             f"its steps' own; search a step version", field="version")
    grid = clean_grid(grid, version)
    count = math.prod(len(v) for v in grid.values())
    if count * seconds > MAX_SECONDS:
        raise InvalidRequest(f"{count} points × {seconds} s = {count * seconds} s of measuring: "
                             f"at most {MAX_SECONDS} s; give fewer points or seconds per point",
                             field="seconds")
    roles = live_traffic_roles(version)
    if roles and not confirm:
        raise LifecycleError(
            f"v{number} takes real traffic ({', '.join(roles)} of {model_name}): a search "
            f"changes its serving settings point by point and loads it; send confirm=true to "
            f"run it anyway", field="confirm", details={"rule": "live-traffic", "roles": roles})
    running = _active_search(version)
    if running is not None:
        raise LifecycleError(f"config search {running.pk} of v{number} is {running.status}: "
                             f"wait for it or cancel it", field="version")
    if Job.objects.filter(version=version, kind=JobKind.LOADTEST, status__in=ACTIVE).exists():
        raise LifecycleError(f"a load test of v{number} is queued or running: the two would "
                             f"measure each other; wait for it", field="version")
    require_key_if_protected(model, key, used_for="this search")
    target, load_first = target_replica(version, replica)
    try:
        with transaction.atomic():
            if load_first:  # replicas load it (pinned only) while the search is queued or runs
                bump_revision()
            search = ConfigSearch.objects.create(
                version=version, grid=grid, concurrency=concurrency, seconds=seconds,
                p99_budget_ms=float(p99_budget_ms), replica=target.replica,
                url=replica_url(target.address), load_first=load_first,
                key_required=bool(key), live_roles=roles, original=settings_of(version),
                points_total=count, created_by=actor.user)
            record(actor, "config_search.create", target_type="version", target=str(version),
                   model_name=model_name,
                   after={"search": search.pk, "grid": grid, "points": count,
                          "seconds": seconds, "concurrency": concurrency,
                          "p99_budget_ms": search.p99_budget_ms, "replica": target.replica,
                          "live_roles": roles, "original": search.original})
            kwargs = {"search_id": search.pk, **({"key": key} if key else {})}
            enqueue("registry.run_config_search", **kwargs)
    except IntegrityError:  # another search of this version was queued in between
        raise LifecycleError(f"a config search of v{number} is already queued or running",
                             field="version") from None
    return search


def config_search_get(*, model_name: str, number: int, search_id: int) -> ConfigSearch:
    search = (ConfigSearch.objects.select_related("version__model", "created_by")
              .filter(pk=search_id, version__model__name=model_name, version__number=number)
              .first())
    if search is None:
        raise NotFound(f"v{number} of {model_name!r} has no config search {search_id}",
                       field="search")
    return search


def config_search_cancel(*, model_name: str, number: int, search_id: int, actor: Actor,
                         reason: str = "") -> ConfigSearch:
    """Stop a queued or running search. A running one notices within half a second and puts
    the version's settings back itself (the recovery tick does, if its worker is gone)."""
    config_search_get(model_name=model_name, number=number, search_id=search_id)
    with transaction.atomic():
        search = ConfigSearch.objects.select_for_update().get(pk=search_id)
        if search.finished:
            raise LifecycleError(f"config search {search_id} is {search.status}: nothing to "
                                 f"cancel", field="search")
        was = search.status
        search.status, search.finished_at = JobStatus.CANCELLED, timezone.now()
        search.failure_reason = f"cancelled by {actor.name}" + (f": {reason}" if reason else "")
        search.save(update_fields=["status", "finished_at", "failure_reason"])
        record(actor, "config_search.cancel", target_type="version",
               target=f"{model_name}:{number}", model_name=model_name,
               before={"status": was}, after={"search": search.pk, "status": search.status},
               reason=reason)
        if was == JobStatus.QUEUED and search.load_first:
            bump_revision()  # never started: the replicas let the version go now
    return search


def config_search_apply(*, model_name: str, number: int, search_id: int, actor: Actor,
                        point: int | None = None) -> ModelVersion:
    """Make a measured point (default: the best) the version's serving settings: one
    version_configure, audited with the search and the point's figures."""
    search = config_search_get(model_name=model_name, number=number, search_id=search_id)
    if not search.finished:
        raise LifecycleError(f"config search {search_id} is {search.status}: apply a point once "
                             f"it is over (it puts the version's own settings back first)",
                             field="search")
    if search.trial is not None:
        raise LifecycleError(f"config search {search_id} has not put v{number}'s own settings "
                             f"back yet; try again in a few seconds", field="search")
    running = _active_search(search.version)
    if running is not None:
        raise LifecycleError(f"config search {running.pk} of v{number} is {running.status}: "
                             f"its trials would undo this; wait for it or cancel it",
                             field="search")
    if point is None:
        if search.best is None:
            raise LifecycleError(
                f"no point of config search {search_id} kept p99 within "
                f"{search.p99_budget_ms:g} ms with no errors: name a point to apply one anyway",
                field="point")
        point = search.best
    measured = search.points[point] if 0 <= point < len(search.points) else None
    if measured is None or measured.get("failure") or measured.get("rps") is None:
        raise InvalidRequest(f"point must be one that config search {search_id} measured "
                             f"(0 to {len(search.points) - 1})", field="point")
    with transaction.atomic():
        version = version_configure(model_name=model_name, number=number, actor=actor,
                                    **measured["settings"])
        ConfigSearch.objects.filter(pk=search.pk).update(applied_point=point)
        record(actor, "config_search.apply", target_type="version", target=str(version),
               model_name=model_name,
               after={"search": search.pk, "point": point, "best": point == search.best,
                      "settings": measured["settings"], "rps": measured["rps"],
                      "p99_ms": measured["p99_ms"], "p99_budget_ms": search.p99_budget_ms})
    return version
