"""Replicas in the observed state and their credentials.

A heartbeat replaces a replica's row (and stores its stats samples); a graceful stop removes it;
an operator removes a lost one (a live one would only come back with its next heartbeat), and
housekeeping forgets those silent for MMC_REPLICA_FORGET_SECONDS (both audited). A replica that
follows the control plane over HTTP shows a replica credential: made by an admin, shown once,
revocable, good for the replica API only (registry/replica_api.py)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from registry.audit import Actor, record
from registry.errors import InvalidRequest, LifecycleError, NotFound
from registry.metrics import record_samples
from registry.models import ReplicaCredential, ReplicaHeartbeat
from registry.notify import current_revision
from serving.core.desired_state import ObservedState

#: A replica credential reads `mmcr_<prefix>_<secret>`; the prefix names it in lists and logs.
CREDENTIAL_SCHEME = "mmcr"
#: The credential named in MMC_REPLICA_TOKEN (compose, Kubernetes: a secret both sides get).
ENVIRONMENT_CREDENTIAL = "environment"


def heartbeat_store(observed: ObservedState, *, address: str, started_at: datetime,
                    now: datetime | None = None) -> None:
    """One replica's heartbeat and its samples, in one commit. `behind_since` keeps its first
    moment while the replica stays behind the current revision (converging, then degraded past
    REPLICA_CONVERGE_SECONDS); at the revision it clears."""
    now = now or timezone.now()
    degraded = (observed.degraded or "")[:200]
    with transaction.atomic():
        behind = observed.revision < current_revision()
        ReplicaHeartbeat.objects.update_or_create(
            replica=observed.replica,
            defaults={"revision": observed.revision, "versions": observed.versions,
                      "degraded": degraded, "address": address[:200], "started_at": started_at,
                      "last_seen": now,
                      "behind_since": Coalesce(F("behind_since"), Value(now)) if behind
                      else None},
            create_defaults={"revision": observed.revision, "versions": observed.versions,
                             "degraded": degraded, "address": address[:200],
                             "started_at": started_at, "last_seen": now,
                             "behind_since": now if behind else None},
        )
        record_samples(observed.replica, observed.versions)


def heartbeat_merge(observed: ObservedState, *, address: str,
                    now: datetime | None = None) -> bool:
    """A heartbeat carrying what changed since the last acknowledged one: those entries replace
    (or join) the row's, the removed keys leave it, and samples are written for the changed
    entries alone. False when there is no row to merge into (removed, forgotten, left): the
    replica must report everything."""
    now = now or timezone.now()
    with transaction.atomic():
        row = ReplicaHeartbeat.objects.select_for_update().filter(
            replica=observed.replica).first()
        if row is None:
            return False
        versions = {k: v for k, v in (row.versions or {}).items() if k not in observed.removed}
        versions.update(observed.changed or {})
        behind = observed.revision < current_revision()
        row.revision, row.versions = observed.revision, versions
        row.degraded, row.address = (observed.degraded or "")[:200], address[:200]
        row.last_seen = now
        row.behind_since = (row.behind_since or now) if behind else None
        row.save(update_fields=["revision", "versions", "degraded", "address", "last_seen",
                                "behind_since"])
        record_samples(observed.replica, observed.changed or {})
    return True


def heartbeats_touch(beats: list[tuple[ObservedState, str]], *,
                     now: datetime | None = None) -> set[str]:
    """Heartbeats whose versions are as last reported ("same"), each (observed, address), in
    one statement (the replica API gathers those that arrive together): each row's revision,
    health, address and last moment only; no versions rewritten, no samples. The names whose
    row was touched; the others have none (removed, forgotten, left) and must report
    everything."""
    if not beats:
        return set()
    now = now or timezone.now()
    table = connection.ops.quote_name(ReplicaHeartbeat._meta.db_table)
    rows, params = [], []
    for observed, address in {o.replica: (o, a) for o, a in beats}.values():
        rows.append("(%s, CAST(%s AS BIGINT), %s, %s)")
        params += [observed.replica, observed.revision, (observed.degraded or "")[:200],
                   address[:200]]
    with transaction.atomic():
        revision = current_revision()
        with connection.cursor() as cur:
            cur.execute(
                f"WITH v(replica, revision, degraded, address) AS (VALUES {', '.join(rows)}) "
                f"UPDATE {table} SET revision = v.revision, degraded = v.degraded, "
                f"address = v.address, last_seen = %s, behind_since = CASE WHEN v.revision < %s "
                f"THEN COALESCE({table}.behind_since, %s) ELSE NULL END "
                f"FROM v WHERE {table}.replica = v.replica RETURNING {table}.replica",
                [*params, now, revision, now])
            return {row[0] for row in cur.fetchall()}


def replica_leave(name: str) -> None:
    """A graceful shutdown: drop the replica's heartbeat, so it is not shown as lost."""
    ReplicaHeartbeat.objects.filter(replica=name).delete()


def _digest(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def credential_create(*, name: str, actor: Actor) -> tuple[ReplicaCredential, str]:
    """A new replica credential (admin); the raw value is returned once, never stored."""
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise InvalidRequest("a replica credential needs a name of 1-100 characters",
                             field="name")
    if name == ENVIRONMENT_CREDENTIAL:
        raise InvalidRequest(f"{name!r} is the name of MMC_REPLICA_TOKEN's credential; "
                             "choose another", field="name")
    prefix = secrets.token_hex(4)
    raw = f"{CREDENTIAL_SCHEME}_{prefix}_{secrets.token_urlsafe(32)}"
    try:
        with transaction.atomic():
            credential = ReplicaCredential.objects.create(
                name=name, prefix=prefix, digest=_digest(raw), created_by=actor.name)
            record(actor, "replica-credential.create", target_type="replica-credential",
                   target=name, after={"prefix": prefix})
    except IntegrityError:
        raise LifecycleError(f"a replica credential named {name!r} exists; revoke it or "
                             "choose another name", field="name") from None
    return credential, raw


def credential_revoke(*, prefix: str, actor: Actor) -> ReplicaCredential:
    """Revoke a replica credential (admin): replicas showing it are refused from their next
    call; what they loaded they keep serving (and say they cannot reach the control plane)."""
    with transaction.atomic():
        credential = ReplicaCredential.objects.select_for_update().filter(prefix=prefix).first()
        if credential is None:
            raise NotFound(f"no replica credential {prefix!r}", field="prefix")
        if credential.revoked_at is not None:
            raise LifecycleError(f"replica credential {credential.name!r} is already revoked",
                                 field="prefix")
        credential.revoked_at = timezone.now()
        credential.save(update_fields=["revoked_at"])
        record(actor, "replica-credential.revoke", target_type="replica-credential",
               target=credential.name, before={"prefix": prefix})
    return credential


def credential_check(raw: str) -> str | None:
    """The name of the live credential `raw` is, or None. MMC_REPLICA_TOKEN (if set) is one."""
    if not raw or len(raw) > 200:
        return None
    configured = settings.REPLICA_TOKEN
    if configured and hmac.compare_digest(raw.encode(), configured.encode()):
        return ENVIRONMENT_CREDENTIAL
    if not raw.startswith(CREDENTIAL_SCHEME + "_"):
        return None
    credential = (ReplicaCredential.objects.filter(digest=_digest(raw), revoked_at__isnull=True)
                  .only("name", "last_used_at").first())
    if credential is None:
        return None
    now = timezone.now()
    if credential.last_used_at is None or now - credential.last_used_at > timedelta(minutes=1):
        ReplicaCredential.objects.filter(pk=credential.pk).update(last_used_at=now)
    return credential.name


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
