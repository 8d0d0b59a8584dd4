"""How many rows one request to a pipeline may carry, from its steps' batch limits. Kept apart
from registry.services.pipelines so that the export integration, which sizes a Triton ensemble
by it, need not import the services layer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from serving.core.tensor_signature import batch_dimension

if TYPE_CHECKING:
    from registry.models import ModelVersion


def batch_size(signature: dict, steps: list[ModelVersion]) -> int:
    """Rows one pipeline request may carry: the smallest of its steps' (0: no batching, when a
    step takes no batch dimension or the pipeline's inputs do not start with one)."""
    if not batch_dimension(signature):
        return 0
    sizes = [v.max_batch_size if batch_dimension(v.signature) else 0 for v in steps]
    return min(sizes) if all(sizes) else 0
