"""Model quality: feedback labels by request id, each version's quality points and its task."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from mmc.transport import Transport


class Quality(Transport):
    def send_feedback(self, model: str,
                      labels: Mapping[str, Any] | Iterable[tuple[str, Any]] | bytes,
                      ) -> dict[str, int]:
        """Ground truth for answered requests: request id -> label (a class index or name, a
        number, or a list of them), or a feedback body as JSON bytes (sent as it is; the server
        checks it). Answers how many were accepted and how many were duplicates (the first
        label of a request id is kept)."""
        if isinstance(labels, bytes):
            return self._call("POST", f"models/{model}/feedback/", content=labels,
                              headers={"Content-Type": "application/json"})
        pairs = labels.items() if isinstance(labels, Mapping) else labels
        body = {"feedback": [{"request_id": rid, "label": label} for rid, label in pairs]}
        return self._call("POST", f"models/{model}/feedback/", json=body)

    def quality(self, model: str, *, seconds: int | None = None) -> dict[str, Any]:
        """Each version's quality points, task, reference metric, and the feedback counts."""
        params = {"seconds": seconds} if seconds else None
        return self._call("GET", f"models/{model}/quality/", params=params)

    def set_task(self, model: str, number: int, task: str) -> dict[str, Any]:
        """A version's task for model quality: "classifier", "regressor" or "" (inferred)."""
        return self._call("PUT", f"models/{model}/versions/{number}/task/", json={"task": task})
