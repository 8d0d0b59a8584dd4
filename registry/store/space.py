"""Free space of the artifact store's filesystem: uploads, job files and temp files share it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import NamedTuple

from django.conf import settings

GIB = 1024**3


class Space(NamedTuple):
    total: int
    free: int


def free_space(root: Path | None = None) -> Space:
    """Bytes free to an unprivileged writer (shutil.disk_usage) under ARTIFACT_ROOT."""
    usage = shutil.disk_usage(root or settings.ARTIFACT_ROOT)
    return Space(total=usage.total, free=usage.free)
