"""A replica's response cache (Triton's per-model response cache): the outputs of earlier
requests, found again by a hash of who answers and what was asked, dropped least recently used
once the replica's byte budget is spent.

What is cached is the model's numpy outputs, not an encoded body: JSON and binary requests of
the same tensors, and requests that ask for different outputs or classification, share one
entry (the encoding picks from it). The key starts with the answering version's identity (model,
version, artifact sha256 and the load it belongs to), so a new version, or the same version
reloaded, never answers from an older one's entry; and a version that unloads takes its entries
with it. Everything here runs on the event loop thread, so nothing takes a lock.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import numpy as np
from cachetools import LRUCache

#: MMC_RESPONSE_CACHE_BYTES' default: the bytes one replica may spend on cached outputs, shared
#: by every version that turns the cache on (0 turns the cache off on the replica).
DEFAULT_RESPONSE_CACHE_BYTES = 64 * 1024 * 1024
#: What an entry costs besides its arrays (key, dict, array headers): so a flood of tiny
#: answers is bounded by the budget too.
ENTRY_OVERHEAD_BYTES = 256
_U64 = struct.Struct("<Q")

Outputs = dict[str, np.ndarray]


@dataclass(frozen=True, slots=True)
class _Entry:
    owner: object
    outputs: Outputs
    nbytes: int


def request_key(identity: bytes, inputs: Outputs) -> bytes:
    """A 128-bit blake2b digest of the answering version's identity and every input's name,
    datatype, shape and bytes (inputs in name order, every part length-prefixed)."""
    h = hashlib.blake2b(identity, digest_size=16)
    update = h.update
    for name in sorted(inputs):
        array = inputs[name]
        raw_name = name.encode()
        update(_U64.pack(len(raw_name)))
        update(raw_name)
        dtype = array.dtype.str.encode()
        update(_U64.pack(len(dtype)))
        update(dtype)
        update(_U64.pack(array.ndim))
        for dim in array.shape:
            update(_U64.pack(dim))
        if array.dtype.kind == "O":  # BYTES: each element's length, then its bytes
            for item in array.ravel().tolist():
                raw = item if isinstance(item, bytes) else str(item).encode(
                    "utf-8", "surrogatepass")
                update(_U64.pack(len(raw)))
                update(raw)
        else:
            update(np.ascontiguousarray(array).data)  # no copy when already contiguous
    return h.digest()


def _frozen(array: np.ndarray) -> np.ndarray:
    """The array as the cache keeps it: its own memory (a row view of a batch's output would
    keep the whole batch alive and weigh more than it says) and read-only."""
    if array.base is not None or not array.flags.c_contiguous:
        array = np.array(array, copy=True, order="C")
    array.flags.writeable = False
    return array


def outputs_nbytes(outputs: Outputs) -> int:
    """What a cached answer weighs: its arrays' bytes (BYTES: each element's length) plus the
    per-entry overhead."""
    total = ENTRY_OVERHEAD_BYTES
    for array in outputs.values():
        if array.dtype.kind == "O":
            total += sum(8 + len(item) for item in array.ravel().tolist())
        else:
            total += array.nbytes
    return total


class _BytesLRU(LRUCache):
    """cachetools' LRU weighed by each entry's bytes, telling its owner what it evicts."""

    def __init__(self, maxsize: int, on_evict) -> None:
        super().__init__(maxsize, getsizeof=lambda entry: entry.nbytes)
        self._on_evict = on_evict

    def popitem(self):
        key, entry = super().popitem()
        self._on_evict(key, entry)
        return key, entry


class ResponseCache:
    """One replica's cached answers, LRU bounded by `capacity_bytes` across all versions."""

    def __init__(self, capacity_bytes: int = DEFAULT_RESPONSE_CACHE_BYTES) -> None:
        self.capacity_bytes = max(0, capacity_bytes)
        self.evictions = 0  # entries pushed out to make room (not those of unloaded versions)
        self._lru = _BytesLRU(max(1, self.capacity_bytes), self._evicted)
        # owner -> {key: bytes}: what each version holds, read without touching LRU order
        self._owned: dict[object, dict[bytes, int]] = {}

    @property
    def enabled(self) -> bool:
        return self.capacity_bytes > 0

    @property
    def used_bytes(self) -> int:
        return int(self._lru.currsize)

    def __len__(self) -> int:
        return len(self._lru)

    def get(self, key: bytes) -> Outputs | None:
        """The cached outputs (read-only arrays in a fresh dict), marked most recently used."""
        entry = self._lru.get(key)
        return dict(entry.outputs) if entry is not None else None

    def put(self, key: bytes, owner: object, outputs: Outputs) -> bool:
        """Keep `outputs` for `key`; False when one answer is larger than the whole budget."""
        if not self.enabled:
            return False
        frozen = {name: _frozen(array) for name, array in outputs.items()}
        entry = _Entry(owner, frozen, outputs_nbytes(frozen))
        if entry.nbytes > self.capacity_bytes:
            return False
        self._lru[key] = entry
        self._owned.setdefault(owner, {})[key] = entry.nbytes
        return True

    def drop(self, owner: object) -> int:
        """Forget every entry of `owner` (a version that unloads); how many there were."""
        keys = self._owned.pop(owner, {})
        for key in keys:
            self._lru.pop(key, None)
        return len(keys)

    def held(self, owner: object) -> tuple[int, int]:
        """(entries, bytes) held for `owner` right now."""
        keys = self._owned.get(owner)
        return (len(keys), sum(keys.values())) if keys else (0, 0)

    def _evicted(self, key: bytes, entry: _Entry) -> None:
        self.evictions += 1
        keys = self._owned.get(entry.owner)
        if keys is not None:
            keys.pop(key, None)
            if not keys:
                del self._owned[entry.owner]
