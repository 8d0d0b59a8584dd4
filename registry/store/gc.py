"""Artifact garbage collection: a blob goes only when no version references it. The periodic
collector waits for a grace period (an upload writes its blob before its version row commits);
a refused upload removes its own blob at once. What interrupted writes left (temp files, tmp/
objects and open multipart uploads of an object store) goes once untouched for the grace period.

Removing a blob and registering a version that references it serialise on the blob's lock
(`lock_blob`), so neither can miss the other."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.db import connection, transaction

from registry.audit import Actor, record
from registry.models import ModelVersion
from registry.store.artifacts import ArtifactStore, StoredBlob, default_store
from registry.store.blobs import Temp

log = logging.getLogger(__name__)


def lock_blob(sha256: str) -> None:
    """Inside a transaction: hold the blob's lock until it ends. SQLite's one write lock (taken
    by BEGIN IMMEDIATE) already serialises every writer; PostgreSQL takes a transaction-level
    advisory lock keyed by the digest."""
    if not connection.in_atomic_block:
        raise RuntimeError("lock_blob needs a transaction")
    if connection.vendor == "postgresql":
        key = int(sha256[:16], 16) - (1 << 63)  # a signed 64-bit key
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])


def discard_unreferenced(blob: StoredBlob, *, store: ArtifactStore | None = None) -> bool:
    """Remove a blob an upload wrote unless a version references it (a refused upload leaves
    nothing behind; the same bytes registered by a concurrent upload stay). True if removed."""
    store = store or default_store()
    with transaction.atomic():
        lock_blob(blob.sha256)
        if ModelVersion.objects.filter(sha256=blob.sha256).exists():
            return False
        store.remove(blob.sha256)
    log.info("removed blob %s of a refused upload", blob.sha256)
    return True


#: Blobs removed per transaction (each holds one advisory lock per blob on PostgreSQL).
BATCH = 256


def stale_temps(store: ArtifactStore, cutoff: float) -> list[Temp]:
    """What interrupted writes left, untouched since `cutoff` (kill -9 or power loss mid-upload).
    A write in progress keeps its temp fresh, so it is never among them."""
    return sorted((t for t in store.temps() if t.mtime < cutoff), key=lambda t: t.name)


def collect_garbage(*, store: ArtifactStore | None = None, grace: timedelta = timedelta(hours=1),
                    dry_run: bool = False) -> dict:
    """Remove blobs no version references and stale temps, both older than `grace`; each run
    that removes something is audited (artifacts.gc) with what it removed."""
    store = store or default_store()
    cutoff = time.time() - grace.total_seconds()
    referenced = set(ModelVersion.objects.values_list("sha256", flat=True))
    candidates = sorted((sha, stat.size) for sha, stat in store.blob_stats()
                        if sha not in referenced and stat.mtime < cutoff)
    temps = stale_temps(store, cutoff)
    if dry_run:
        freed = sum(size for _, size in candidates)
        temp_bytes = sum(t.size for t in temps)
        return {"blobs": [sha for sha, _ in candidates], "bytes": freed + temp_bytes,
                "temp_files": len(temps), "temp_paths": [t.name for t in temps],
                "temp_bytes": temp_bytes, "dry_run": True}
    removed, freed, temps_removed, temp_bytes = [], 0, [], 0
    shas = [sha for sha, _ in candidates]
    batches = [shas[i:i + BATCH] for i in range(0, len(shas), BATCH)]
    for i, batch in enumerate(batches or ([[]] if temps else [])):
        with transaction.atomic():
            # re-check under the blobs' locks: a version may have been registered meanwhile, or
            # an upload of the same bytes may have restarted the grace period
            for sha in batch:
                lock_blob(sha)
            referenced = set(ModelVersion.objects.filter(sha256__in=batch)
                             .values_list("sha256", flat=True))
            stats = {sha: store.stat(sha) for sha in batch if sha not in referenced}
            batch = [sha for sha, stat in stats.items() if stat is not None and stat.mtime < cutoff]
            size = sum(stats[sha].size for sha in batch)
            for sha in batch:
                store.remove(sha)
            gone = [t for t in temps if store.remove_temp(t, cutoff)] if i == 0 else []
            gone_bytes = sum(t.size for t in gone)
            names = [t.name for t in gone]
            if batch or gone:
                record(Actor.system("gc"), "artifacts.gc", target_type="store",
                       target=store.location,
                       after={"blobs": batch, "bytes": size + gone_bytes,
                              "temp_files": len(gone), "temp_paths": names,
                              "temp_bytes": gone_bytes})
        removed += batch
        freed += size + gone_bytes
        temps_removed += names
        temp_bytes += gone_bytes
    if temps_removed:
        log.info("removed %d stale temp(s), %d bytes: %s", len(temps_removed), temp_bytes,
                 ", ".join(temps_removed))
    return {"blobs": removed, "bytes": freed, "temp_files": len(temps_removed),
            "temp_paths": temps_removed, "temp_bytes": temp_bytes, "dry_run": False}
