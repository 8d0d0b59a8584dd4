"""The running of a serving-config search (registry.services.config_search), as one background
job: each point of the grid put on the version with `version_configure` (audited as the
search), waited for until the replica has reloaded it, warmed up and measured with the load
test's generator; the version's own settings put back at the end whatever happens, and by the
recovery tick when the worker died. Settings someone else changes meanwhile are theirs: the
search stops and leaves them."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from registry.audit import Actor, record
from registry.background import enqueue, every
from registry.jobs.lease import JobFailed, lease_seconds, worker_name
from registry.jobs.loadtest import infer_url, measure, request_body
from registry.models import ConfigSearch, JobStatus, ModelVersion, ReplicaHeartbeat
from registry.notify import bump_revision, current_revision
from registry.services.config_search import DIMENSIONS, choose_best, grid_points, settings_of
from registry.services.versions import version_configure
from serving.core.desired_state import SCALED_TO_ZERO

log = logging.getLogger(__name__)

WARMUP_REQUESTS = 2     # per request in flight, after each reload, not counted
POLL = 0.25


class SearchFailed(Exception):
    """The search cannot go on; the message is the reason a person reads."""


class Stopped(Exception):
    """Cancelled, or no longer this worker's: put the settings back, write no outcome."""


def _actor(search: ConfigSearch) -> Actor:
    """Who changes the version's settings while it runs: the search, on behalf of its starter."""
    return Actor(user=search.created_by, name=f"config search {search.pk}")


def _claim(search_id: int) -> ConfigSearch | None:
    """Take a queued search; None when it is cancelled, finished or someone else's."""
    with transaction.atomic():
        search = (ConfigSearch.objects.select_for_update(of=("self",))
                  .select_related("version__model", "created_by").filter(pk=search_id).first())
        if search is None or search.status != JobStatus.QUEUED:
            return None
        now = timezone.now()
        search.status, search.worker = JobStatus.RUNNING, worker_name()
        search.heartbeat_at = search.started_at = now
        search.save(update_fields=["status", "worker", "heartbeat_at", "started_at"])
    return search


def _beat(search: ConfigSearch, **fields) -> bool:
    """Renew the heartbeat (and write `fields`); False once the search is no longer ours."""
    return bool(ConfigSearch.objects.filter(pk=search.pk, worker=search.worker,
                                            status=JobStatus.RUNNING)
                .update(heartbeat_at=timezone.now(), **fields))


def _progress(search: ConfigSearch, **progress) -> None:
    if not _beat(search, progress=progress):
        raise Stopped()


def _changed_meanwhile(expected: dict, now: dict) -> str:
    diff = ", ".join(f"{k} {expected[k]} → {now[k]}" for k in DIMENSIONS if expected[k] != now[k])
    return f"the version's settings were changed during the search, not by it ({diff})"


def _apply_trial(search: ConfigSearch, point: dict) -> int:
    """Put `point` on the version (a no-op where it already is); the revision to wait for."""
    version = search.version
    with transaction.atomic():
        locked = ModelVersion.objects.select_for_update().get(pk=version.pk)
        now = settings_of(locked)
        expected = search.trial or search.original
        if now != expected:
            raise SearchFailed(_changed_meanwhile(expected, now) + ": stopped, and left them")
        changes = {k: v for k, v in point.items() if now[k] != v}
        if changes:
            version_configure(model_name=version.model.name, number=version.number,
                              actor=_actor(search), **changes)
        ConfigSearch.objects.filter(pk=search.pk).update(trial=point)
        revision = current_revision()
    search.trial = point
    return revision


def _wait_reloaded(search: ConfigSearch, index: int, revision: int) -> str:
    """Wait until the replica runs `revision` with the version loaded: "" then, else why not
    (its load failed, or took over MMC_LOADTEST_LOAD_SECONDS)."""
    key = f"{search.version.model.name}:{search.version.number}"
    deadline = time.monotonic() + settings.LOADTEST_LOAD_SECONDS
    while True:
        _progress(search, point=index, phase="reloading")
        row = ReplicaHeartbeat.objects.filter(replica=search.replica).first()
        if row is None or row.lost:
            raise SearchFailed(f"replica {search.replica!r} is gone (no heartbeat): stopped")
        state = (row.versions or {}).get(key) or {}
        if row.revision >= revision:
            if state.get("state") in ("READY", SCALED_TO_ZERO):
                return ""
            if state.get("state") == "FAILED":
                return f"the replica could not load it so: {state.get('reason') or 'failed'}"
        if time.monotonic() > deadline:
            return (f"the replica did not reload it within {settings.LOADTEST_LOAD_SECONDS} s "
                    f"(state: {state.get('state') or 'not loaded'})")
        time.sleep(POLL)


def _measure(search: ConfigSearch, index: int, key: str | None) -> dict:
    version = search.version
    url = infer_url(search.url, version.model.name, version.number)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    body = request_body(version.signature)

    def progress(done: int, elapsed: float) -> None:
        _progress(search, point=index, phase="measuring", requests=done,
                  rps=round(done / elapsed, 1) if elapsed > 0 else None)

    measure(url, body, headers, concurrency=search.concurrency,  # after a reload: not counted
            requests=WARMUP_REQUESTS * search.concurrency, seconds=search.seconds,
            on_progress=lambda done, elapsed: _progress(search, point=index,
                                                        phase="warming up"))
    s = measure(url, body, headers, concurrency=search.concurrency, seconds=search.seconds,
                on_progress=progress)
    figures = {k: s[k] for k in ("rps", "p50_ms", "p95_ms", "p99_ms", "requests", "ok",
                                 "errors")}
    if not s["requests"]:
        figures["failure"] = f"no request finished within {search.seconds} s"
    elif not s["ok"]:
        first = next(iter(s["errors"]))
        figures["failure"] = f"every request failed ({first} × {s['errors'][first]})"
    return figures


def _sweep(search: ConfigSearch, key: str | None) -> None:
    if search.key_required and not key:
        raise SearchFailed("the endpoint needs a predict key and keys are never stored: the "
                           "search was interrupted before it began; start it again")
    for index, point in enumerate(grid_points(search.grid, search.original)):
        _progress(search, point=index, phase="applying")
        failure = _wait_reloaded(search, index, _apply_trial(search, point))
        measured = {"failure": failure} if failure else _measure(search, index, key)
        search.points = [*search.points, {"settings": point, **measured}]
        if not _beat(search, points=search.points):
            raise Stopped()


def restore(search_id: int) -> str:
    """Put the version's own settings back if the search left a trial on it (a no-op
    otherwise); settings someone else changed meanwhile are theirs and stay. What was done, in
    words."""
    with transaction.atomic():
        search = (ConfigSearch.objects.select_for_update(of=("self",))
                  .select_related("version__model", "created_by").get(pk=search_id))
        if search.trial is None:
            return search.restore_note
        version = ModelVersion.objects.select_for_update().get(pk=search.version_id)
        now = settings_of(version)
        if now != search.trial:
            note = _changed_meanwhile(search.trial, now) + ": left as they are"
        else:
            changes = {k: v for k, v in search.original.items() if now[k] != v}
            if changes:
                version_configure(model_name=search.version.model.name,
                                  number=search.version.number, actor=_actor(search), **changes)
            note = "the version's own settings were put back"
        search.trial, search.restore_note = None, note
        search.save(update_fields=["trial", "restore_note"])
    return note


def _finish(search: ConfigSearch, status: str | None, reason: str) -> None:
    """Choose the best point, and record the outcome unless a cancel (or a takeover) wrote it."""
    with transaction.atomic():
        current = ConfigSearch.objects.select_for_update().select_related("version__model").get(
            pk=search.pk)
        current.best = choose_best(current.points, current.p99_budget_ms)
        current.progress = {}
        ours = current.status == JobStatus.RUNNING and current.worker == search.worker
        if ours and status is not None:
            current.status, current.failure_reason = status, reason[:4000]
            current.finished_at = timezone.now()
        current.save()
        best = current.best_point
        record(Actor.system("config-search"), f"config_search.{current.status}",
               target_type="version", target=str(current.version),
               model_name=current.version.model.name,
               after={"search": current.pk, "status": current.status,
                      "points": len(current.points), "best": current.best,
                      "best_settings": best["settings"] if best else None,
                      "reason": current.failure_reason[:500],
                      "restored": current.restore_note})
        if current.load_first:
            bump_revision()  # the replicas let go of the version it had them load


def config_search_run(search_id: int, *, key: str | None = None) -> str:
    """Run a queued search to its outcome (the background task): each point applied, waited
    for, warmed up and measured; the version's own settings put back whatever happens."""
    search = _claim(search_id)
    if search is None:
        return "skipped"
    status, reason = JobStatus.SUCCEEDED, ""
    with every(lease_seconds() / 3, _beat, search):
        try:
            _sweep(search, key)
        except Stopped:
            status = None
        except (SearchFailed, JobFailed) as exc:
            status, reason = JobStatus.FAILED, str(exc)
        except Exception as exc:
            log.exception("config search %s crashed", search.pk)
            status, reason = JobStatus.FAILED, f"{exc.__class__.__name__}: {exc}"
        finally:
            try:
                restore(search.pk)
            except Exception:  # the recovery tick tries again once the heartbeat lapses
                log.exception("config search %s could not put the settings back", search.pk)
    _finish(search, status, reason)
    return status or "stopped"


def recover_config_searches(*, queued: bool = False) -> list[int]:
    """Searches a dead worker left: settings put back, marked failed. With `queued`, queued
    searches whose message may have been lost are sent again (their key, if any, is not)."""
    cutoff = timezone.now() - timedelta(seconds=lease_seconds())
    left = list(ConfigSearch.objects.filter(
        Q(status=JobStatus.RUNNING) | Q(trial__isnull=False), heartbeat_at__lt=cutoff)
        .values_list("pk", flat=True))
    for pk in left:
        restore(pk)
        with transaction.atomic():
            search = ConfigSearch.objects.select_for_update().select_related(
                "version__model").get(pk=pk)
            if search.status != JobStatus.RUNNING or search.heartbeat_at >= cutoff:
                continue
            search.status, search.finished_at = JobStatus.FAILED, timezone.now()
            search.failure_reason = ("its worker stopped during the search (killed or "
                                     "restarted): " + search.restore_note)
            search.best = choose_best(search.points, search.p99_budget_ms)
            search.save()
            record(Actor.system("config-search"), "config_search.failed", target_type="version",
                   target=str(search.version), model_name=search.version.model.name,
                   after={"search": pk, "status": search.status,
                          "reason": search.failure_reason})
            if search.load_first:
                bump_revision()
    if queued:
        with transaction.atomic():
            for pk in ConfigSearch.objects.filter(status=JobStatus.QUEUED,
                                                  created_at__lt=cutoff).values_list("pk",
                                                                                     flat=True):
                enqueue("registry.run_config_search", search_id=pk)
    return left
