"""Removing replicas from the observed state: an operator removes a lost one (a live one would
only come back with its next heartbeat), housekeeping forgets those silent for
MMC_REPLICA_FORGET_SECONDS. Both audited."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from registry.audit import Actor, record
from registry.errors import LifecycleError, NotFound
from registry.models import ReplicaHeartbeat


def _snapshot(r: ReplicaHeartbeat) -> dict:
    return {"revision": r.revision, "address": r.address, "last_seen": r.last_seen.isoformat(),
            "started_at": r.started_at.isoformat()}


def replica_remove(*, name: str, actor: Actor, reason: str = "") -> None:
    """Forget a lost replica (killed, its host gone). A live one is refused: it heartbeats."""
    with transaction.atomic():
        replica = ReplicaHeartbeat.objects.select_for_update().filter(replica=name).first()
        if replica is None:
            raise NotFound(f"replica {name!r} is not known", field="replica")
        if not replica.lost:
            raise LifecycleError(
                f"replica {name!r} is live (last heartbeat "
                f"{(timezone.now() - replica.last_seen).total_seconds():.0f} s ago); stop it "
                f"first: a live replica reappears with its next heartbeat", field="replica",
                details={"state": "live"})
        before = _snapshot(replica)
        replica.delete()
        record(actor, "replica.remove", target_type="replica", target=name, before=before,
               reason=reason)


def replicas_forget(*, actor: Actor, now=None) -> list[str]:
    """Remove replicas silent for longer than REPLICA_FORGET_SECONDS; their names."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.REPLICA_FORGET_SECONDS)
    gone = []
    with transaction.atomic():
        for replica in ReplicaHeartbeat.objects.select_for_update().filter(last_seen__lt=cutoff):
            name, before = replica.replica, _snapshot(replica)
            replica.delete()  # clears replica.replica, its primary key
            record(actor, "replica.forget", target_type="replica", target=name, before=before,
                   reason=f"silent for more than {settings.REPLICA_FORGET_SECONDS:.0f} s")
            gone.append(name)
    return gone
