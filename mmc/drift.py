"""Baselines and drift: a version's feature statistics (from a dataset or captured traffic) and
an endpoint's drift thresholds, episodes and latest comparisons."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from mmc.transport import Transport


class Drift(Transport):
    def get_baseline(self, model: str, version: int) -> dict[str, Any]:
        """The version's baseline: {"inputs": {feature: summary}, "outputs": {...}} and where
        it came from. NotFound when it has none."""
        return self._call("GET", f"models/{model}/versions/{version}/baseline/")

    def set_baseline(self, model: str, version: int, *, dataset: str | None = None,
                     since: datetime | str | None = None,
                     until: datetime | str | None = None) -> dict[str, Any]:
        """Compute the version's baseline from an uploaded dataset (its id), or else from its
        captured traffic in [since, until] (default: the last hour). A dataset that does not
        fit the signature: BadRequest naming the tensor, nothing written."""
        body: dict[str, Any] = {}
        if dataset is not None:
            body["dataset"] = str(dataset)
        for key, value in (("since", since), ("until", until)):
            if value is not None:
                body[key] = value.isoformat() if isinstance(value, datetime) else value
        return self._call("POST", f"models/{model}/versions/{version}/baseline/", json=body)

    def get_drift(self, model: str) -> dict[str, Any]:
        """Thresholds, recent episodes and each deployed version's latest points per feature."""
        return self._call("GET", f"models/{model}/endpoint/drift/")

    def set_drift(self, model: str, *, psi_threshold: float | None = None,
                  p_value: float | None = None, window_minutes: int | None = None,
                  min_samples: int | None = None) -> dict[str, Any]:
        """Change some drift thresholds (left out: unchanged). Out of range: BadRequest naming
        the field, nothing changed."""
        body = {k: v for k, v in (("psi_threshold", psi_threshold), ("p_value", p_value),
                                  ("window_minutes", window_minutes),
                                  ("min_samples", min_samples)) if v is not None}
        return self._call("PUT", f"models/{model}/endpoint/drift/", json=body)
