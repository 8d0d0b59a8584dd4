"""Artifact garbage collection: a blob goes only when no version references it. The periodic
collector waits for a grace period (an upload writes its blob before its version row commits);
a refused upload removes its own blob at once.

Removing a blob and registering a version that references it serialise on the blob's lock
(`lock_blob`), so neither can miss the other."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from pathlib import Path

from django.db import connection, transaction

from registry.audit import Actor, record
from registry.models import ModelVersion
from registry.store.artifacts import ArtifactStore, StoredBlob, default_store

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


def temp_dirs(store: ArtifactStore) -> list[Path]:
    """Where uploads stage their bytes: the store's tmp/ (blob writer, Django's
    FILE_UPLOAD_TEMP_DIR) and jobs/tmp/ (request bodies and datasets of jobs)."""
    return [store.tmp_dir, store.root / "jobs" / "tmp"]


def stale_temp_files(store: ArtifactStore, cutoff: float) -> list[Path]:
    """Temp files not written since `cutoff`: left by a crash (kill -9, power loss) mid-upload.
    An upload in progress keeps writing, so its file's modification time stays fresh."""
    found = []
    for folder in temp_dirs(store):
        if folder.is_dir():
            found += [p for p in folder.iterdir() if p.is_file() and _mtime(p) < cutoff]
    return sorted(found)


def collect_garbage(*, store: ArtifactStore | None = None, grace: timedelta = timedelta(hours=1),
                    dry_run: bool = False) -> dict:
    """Remove blobs no version references and stale temp files, both older than `grace`; each
    run that removes something is audited (artifacts.gc) with what it removed."""
    store = store or default_store()
    cutoff = time.time() - grace.total_seconds()
    referenced = set(ModelVersion.objects.values_list("sha256", flat=True))
    candidates = [sha for sha in store.blobs()
                  if sha not in referenced and _mtime(store.path_for(sha)) < cutoff]
    temps = stale_temp_files(store, cutoff)
    if dry_run:
        freed = sum(_size(store.path_for(sha)) for sha in candidates)
        temp_bytes = sum(_size(p) for p in temps)
        return {"blobs": candidates, "bytes": freed + temp_bytes, "temp_files": len(temps),
                "temp_paths": [_name(store, p) for p in temps], "temp_bytes": temp_bytes,
                "dry_run": True}
    removed, freed, temps_removed, temp_bytes = [], 0, [], 0
    batches = [candidates[i:i + BATCH] for i in range(0, len(candidates), BATCH)]
    for i, batch in enumerate(batches or ([[]] if temps else [])):
        with transaction.atomic():
            # re-check under the blobs' locks: a version may have been registered meanwhile, or
            # an upload of the same bytes may have restarted the grace period
            for sha in batch:
                lock_blob(sha)
            referenced = set(ModelVersion.objects.filter(sha256__in=batch)
                             .values_list("sha256", flat=True))
            batch = [sha for sha in batch
                     if sha not in referenced and _mtime(store.path_for(sha)) < cutoff]
            size = sum(_size(store.path_for(sha)) for sha in batch)
            for sha in batch:
                store.remove(sha)
            gone = _remove_temps(temps, cutoff) if i == 0 else []
            gone_bytes = sum(n for _, n in gone)
            names = [_name(store, p) for p, _ in gone]
            if batch or gone:
                record(Actor.system("gc"), "artifacts.gc", target_type="store",
                       target=str(store.root),
                       after={"blobs": batch, "bytes": size + gone_bytes,
                              "temp_files": len(gone), "temp_paths": names,
                              "temp_bytes": gone_bytes})
        removed += batch
        freed += size + gone_bytes
        temps_removed += names
        temp_bytes += gone_bytes
    if temps_removed:
        log.info("removed %d stale temp file(s), %d bytes: %s", len(temps_removed), temp_bytes,
                 ", ".join(temps_removed))
    return {"blobs": removed, "bytes": freed, "temp_files": len(temps_removed),
            "temp_paths": temps_removed, "temp_bytes": temp_bytes, "dry_run": False}


def _remove_temps(temps: list[Path], cutoff: float) -> list[tuple[Path, int]]:
    """Unlink each temp file still untouched since `cutoff` (looked at again: an upload may have
    written to it since the listing); the removed ones with their sizes."""
    gone = []
    for path in temps:
        size = _size(path)
        if _mtime(path) < cutoff:
            path.unlink(missing_ok=True)
            gone.append((path, size))
    return gone


def _name(store: ArtifactStore, path: Path) -> str:
    return str(path.relative_to(store.root))


def _mtime(path) -> float:
    """Modification time; a file removed meanwhile counts as brand new (nothing to collect)."""
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return float("inf")


def _size(path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
