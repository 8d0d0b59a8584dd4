"""Requests checked against a version's signature before the model runs (names, datatypes,
ranks, fixed dimensions, batch size). The signature itself is extracted at upload by the
registry (registry/signatures.py); this module needs no onnx, so replicas never import it.
"""

from __future__ import annotations

import numpy as np

from serving.core.errors import InvalidInput
from serving.core.tensors import InputTensor

#: Rows a batchable version batches up to when nobody configured max_batch_size.
DEFAULT_MAX_BATCH_SIZE = 32


def example_shape(shape: list | None) -> list[int]:
    """The shape of an example request tensor: dynamic (-1) dimensions become 1; an unknown
    rank becomes a single element."""
    if not shape:
        return [1]
    return [d if isinstance(d, int) and d > 0 else 1 for d in shape]


def example_data(datatype: str, count: int) -> list:
    """`count` deterministic example values of a v2 datatype, as a JSON request carries them
    (the console's try-it form and the load test send the same)."""
    if datatype == "BOOL":
        return [i % 2 == 0 for i in range(count)]
    if datatype == "BYTES":
        return ["example"] * count
    if datatype.startswith(("FP", "BF")):
        return [round(((i * 7) % 11) / 10 - 0.5, 2) for i in range(count)]
    return [i % 10 for i in range(count)]


def batch_dimension(signature: dict) -> bool:
    """True when every input's first dimension is dynamic, so requests can be batched."""
    inputs = signature.get("inputs") or []
    return bool(inputs) and all(
        spec["shape"] and spec["shape"][0] == -1 for spec in inputs
    )


def validate_inputs(
    request_inputs: list[InputTensor], signature: dict, max_batch_size: int,
) -> dict[str, np.ndarray]:
    """Check a decoded request against the version's signature before it reaches the model:
    names, datatypes, ranks, fixed dimensions and the batch size. Returns name -> array."""
    specs = {spec["name"]: spec for spec in signature["inputs"]}
    batched = max_batch_size > 0 and batch_dimension(signature)
    feeds: dict[str, np.ndarray] = {}
    batch_of: tuple[str, int] | None = None
    for tensor in request_inputs:
        name = tensor.name
        spec = specs.get(name)
        if spec is None:
            raise InvalidInput(
                f"unknown input '{name}' (the model takes {', '.join(specs) or 'no inputs'})"
            )
        if name in feeds:
            raise InvalidInput(f"input '{name}' appears more than once")
        if tensor.datatype != spec["datatype"]:
            raise InvalidInput(
                f"input '{name}': datatype {tensor.datatype} does not match the model's "
                f"{spec['datatype']}"
            )
        shape = list(tensor.array.shape)
        expected = spec["shape"]
        if expected is not None:
            if len(shape) != len(expected):
                raise InvalidInput(
                    f"input '{name}': shape {shape} has rank {len(shape)} but the model "
                    f"expects rank {len(expected)} {expected}"
                )
            for axis, (got, want) in enumerate(zip(shape, expected, strict=True)):
                if want != -1 and got != want:
                    raise InvalidInput(
                        f"input '{name}': shape {shape} has {got} at dimension {axis} but the "
                        f"model expects {want} {expected}"
                    )
        if batched:
            batch = shape[0]
            if batch > max_batch_size:
                raise InvalidInput(
                    f"input '{name}': batch size {batch} exceeds max_batch_size {max_batch_size}"
                )
            if batch_of is None:
                batch_of = (name, batch)
            elif batch != batch_of[1]:
                raise InvalidInput(
                    f"input '{name}': batch size {batch} differs from input "
                    f"'{batch_of[0]}' batch size {batch_of[1]}"
                )
        feeds[name] = tensor.array
    missing = [name for name in specs if name not in feeds]
    if missing:
        raise InvalidInput(f"missing input {', '.join(repr(m) for m in missing)}")
    return feeds


def validate_outputs(requested_names: list[str], signature: dict) -> None:
    """Reject a request naming an output the model does not have, before running it."""
    known = [spec["name"] for spec in signature["outputs"]]
    for name in requested_names:
        if name not in known:
            raise InvalidInput(f"unknown output '{name}' (the model produces {', '.join(known)})")
