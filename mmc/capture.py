"""Data capture of an endpoint: the share of requests replicas record, which tensors, the byte
cap of one record and the retention; and what the live replicas captured and dropped."""

from __future__ import annotations

from typing import Any

from mmc.transport import Transport


class Capture(Transport):
    def get_capture(self, model: str) -> dict[str, Any]:
        """Settings (percent, mode, max_bytes, retention_days) and, per version, the records
        the live replicas captured, dropped (queue full), wrote and lost."""
        return self._call("GET", f"models/{model}/endpoint/capture/")

    def set_capture(self, model: str, *, percent: float | None = None, mode: str | None = None,
                    max_bytes: int | None = None, retention_days: int | None = None,
                    reason: str = "") -> dict[str, Any]:
        """Change some capture settings (left out: unchanged); percent 0 turns capture off.
        Out of range: BadRequest naming the setting, nothing changed."""
        body = {k: v for k, v in (("percent", percent), ("mode", mode),
                                  ("max_bytes", max_bytes), ("retention_days", retention_days))
                if v is not None}
        return self._call("PUT", f"models/{model}/endpoint/capture/",
                          json={**body, "reason": reason})
