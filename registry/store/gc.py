"""Artifact garbage collection: a blob goes only when no version references it, and only once
it is older than a grace period (an upload writes its blob before its version row commits)."""

from __future__ import annotations

import time
from datetime import timedelta

from django.db import transaction

from registry.audit import Actor, record
from registry.models import ModelVersion
from registry.store.artifacts import ArtifactStore, default_store


def collect_garbage(*, store: ArtifactStore | None = None, grace: timedelta = timedelta(hours=1),
                    dry_run: bool = False) -> dict:
    store = store or default_store()
    cutoff = time.time() - grace.total_seconds()
    referenced = set(ModelVersion.objects.values_list("sha256", flat=True))
    blobs = [sha for sha in store.blobs()
             if sha not in referenced and store.path_for(sha).stat().st_mtime < cutoff]
    temps = [p for p in store.tmp_dir.iterdir() if p.stat().st_mtime < cutoff]
    freed = sum(store.path_for(sha).stat().st_size for sha in blobs)
    if not dry_run and (blobs or temps):
        with transaction.atomic():
            # re-check under the transaction: a version may have been registered meanwhile
            referenced = set(ModelVersion.objects.filter(sha256__in=blobs)
                             .values_list("sha256", flat=True))
            blobs = [sha for sha in blobs if sha not in referenced]
            for sha in blobs:
                store.remove(sha)
            for path in temps:
                path.unlink(missing_ok=True)
            record(Actor.system("gc"), "artifacts.gc", target_type="store",
                   target=str(store.root), after={"blobs": blobs, "temp_files": len(temps),
                                                  "bytes": freed})
    return {"blobs": blobs, "temp_files": len(temps), "bytes": freed, "dry_run": dry_run}
