"""The automated canary analysis must not go silent (registry.ticks says when it last ran):
while its tick is stale, a running analysis drops its candidate's weight to 0 and pauses
(audited as endpoint.analysis.stale) instead of leaving a candidate nobody judges at its share.
Any process that notices does it: the console on health and page requests, the embedded
scheduler (the periodic task registry.analysis_watch), a replica that follows the registry when
it polls."""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime

from django.conf import settings

from registry.audit import Actor
from registry.errors import LifecycleError
from registry.models import Endpoint
from registry.services import rollouts
from registry.ticks import TickAge, tick_age

log = logging.getLogger(__name__)

ACTOR = "analysis-watch"


def drop_stale(*, now: datetime | None = None, found: TickAge | None = None) -> list[str]:
    """While the tick is stale, every running analysis drops its candidate to 0 % and pauses
    (audited once: a paused analysis is not running). The names of the endpoints dropped."""
    found = found or tick_age(now=now)
    if not found.stale:
        return []
    dropped = []
    for ep in Endpoint.objects.filter(candidate__isnull=False).select_related("model"):
        analysis = ep.rollout.analysis
        if not analysis or analysis.paused:
            continue
        try:
            if rollouts.analysis_stale(model_name=ep.model.name, why=found.text,
                                       actor=Actor.system(ACTOR)):
                dropped.append(ep.model.name)
        except LifecycleError:  # changed meanwhile (promoted, aborted): nothing to drop
            continue
    if dropped:
        log.warning("%s: candidate weight dropped to 0 on %s", found.text, ", ".join(dropped))
    return dropped


_last_watch = 0.0
_watch_lock = threading.Lock()


def watch(*, every: float | None = None) -> list[str]:
    """drop_stale at most once per `every` seconds in this process (default the tick
    interval), never raising: for loops that poll often (a serving replica, the scheduler)."""
    global _last_watch
    every = max(settings.ROLLOUT_TICK_SECONDS, 1.0) if every is None else every
    with _watch_lock:
        if time.monotonic() - _last_watch < every:
            return []
        _last_watch = time.monotonic()
    try:
        return drop_stale()
    except Exception:  # a watcher never breaks its host's loop; the next one looks again
        log.exception("canary analysis watch failed")
        return []
