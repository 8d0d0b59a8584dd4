"""When the automated canary analysis last ran: its tick (registry.services.analysis.tick, run by
Celery beat clustered, the embedded scheduler otherwise) records each pass in the database, so
every process that reads it (console, worker, a replica that follows the registry) can tell the
analysis has gone silent: stale past ANALYSIS_STALE_SECONDS (3 x MMC_ROLLOUT_TICK_SECONDS, at
least 30 s, by default). What is done about it is registry.services.analysis_watch."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from registry.errors import LifecycleError
from registry.models import TickRecord

#: The periodic task whose passes are recorded.
TICK = "registry.rollout_tick"


def tick_recorded(*, at: datetime | None = None) -> None:
    """The analysis tick finished a pass (not audited: bookkeeping, not a change)."""
    TickRecord.objects.update_or_create(name=TICK,
                                        defaults={"last_run_at": at or timezone.now()})


@dataclass(frozen=True)
class TickAge:
    """How long ago the analysis tick last finished (None: never), against its bound."""

    last_run_at: datetime | None
    age: float | None
    interval: float  # this process's MMC_ROLLOUT_TICK_SECONDS (0: the tick runs elsewhere)
    bound: float

    @property
    def stale(self) -> bool:
        return self.age is None or self.age > self.bound

    @property
    def text(self) -> str:
        every = f"it runs every {self.interval:g} s: " if self.interval > 0 else ""
        ask = f" ({every}is Celery beat or the scheduler running?)"
        if self.age is None:
            return "canary analysis has never run" + ask
        if self.stale:
            return f"canary analysis has not run for {self.age:.0f} s" + ask
        return f"ran {self.age:.0f} s ago" + (f" (every {self.interval:g} s)" if every else "")


def tick_age(*, now: datetime | None = None) -> TickAge:
    now = now or timezone.now()
    last = TickRecord.objects.filter(name=TICK).values_list("last_run_at", flat=True).first()
    return TickAge(last_run_at=last,
                   age=None if last is None else max((now - last).total_seconds(), 0.0),
                   interval=settings.ROLLOUT_TICK_SECONDS, bound=settings.ANALYSIS_STALE_SECONDS)


def require_ticking(*, now: datetime | None = None) -> None:
    """Refuse (409) to start or resume an analysis nothing would run."""
    found = tick_age(now=now)
    if found.stale:
        raise LifecycleError(f"{found.text[0].upper()}{found.text[1:]}: a canary with an "
                             "automated analysis plan cannot start or resume until it runs; "
                             "set the weights by hand instead",
                             details={"analysis_tick_age": found.age})
