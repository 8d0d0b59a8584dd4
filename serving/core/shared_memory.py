"""System shared memory (Triton's extension): regions that a client on this machine registers
by the key of a POSIX shared-memory object, so that inference inputs are read from them and
outputs written into them instead of travelling in the request and the answer.

No transport here: the fronts adapt register / unregister / status to SharedMemoryRegistry, the
codecs turn the `shared_memory_*` parameters into places (serving.core.tensors), and the data
plane reads and writes through `attach` / `write_outputs`, only for requests that use it.

Mapping a file a caller names is the risk, so a key is one name under /dev/shm (no directory,
no `..`), opened without following a symlink, and only a regular file is mapped; a region must
lie inside the object, and the process maps at most `max_regions` regions and `max_bytes` bytes.
Any client that reaches the server can name any object the server's user may open, which is
why it is off unless the operator turns it on (MMC_SHM; docs/guide/inference.md).
"""

from __future__ import annotations

import math
import mmap
import os
import stat
from dataclasses import dataclass

import numpy as np

from serving.core.dtypes import DATATYPES
from serving.core.errors import InvalidInput, NotSupported
from serving.core.gpu import gpu_available
from serving.core.tensors import (
    InferRequest,
    SharedMemoryPlace,
    binary_block,
    binary_bytes,
    datatype_of,
)

#: Where POSIX shared-memory objects live on Linux: a key `/name` is the file /dev/shm/name.
ROOT = "/dev/shm"
#: The longest region name and key: a key is one file name (NAME_MAX).
MAX_NAME_CHARS = 255
_OPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def shared_memory_off() -> NotSupported:
    """The answer to a shared-memory call or tensor on a server that does not offer it."""
    return NotSupported(
        "system shared memory is off on this server: it is for clients on the server's own "
        "machine, and only a server started with MMC_SHM=on offers it; send the tensors in "
        "the request instead")


def cuda_shared_memory_refusal() -> NotSupported:
    """CUDA shared memory is not offered; the message says why on this host."""
    why = ("this server has no GPU" if not gpu_available()
           else "this server does not import CUDA IPC handles")
    return NotSupported(f"CUDA shared memory is not offered: {why}; use system shared memory "
                        "(MMC_SHM=on) or send the tensors in the request")


@dataclass(eq=False)
class _Region:
    name: str
    key: str
    offset: int  # in the object
    byte_size: int
    mapping: mmap.mmap  # from the page that holds `offset`
    start: int  # where the region begins in `mapping`

    def status(self) -> dict:
        return {"name": self.name, "key": self.key, "offset": self.offset,
                "byte_size": self.byte_size}


class SharedMemoryRegistry:
    """The system shared-memory regions registered with this process, by name.

    Used from the event loop only (every front's calls run there), so it takes no lock. The
    bounds come from serving.edge_limits.EdgeLimits (MMC_SHM_MAX_REGIONS, MMC_SHM_MAX_BYTES).
    A region's mapping is released on unregister and at `close` (shutdown); a request still
    reading it keeps it mapped until that request is done.
    """

    def __init__(self, *, max_regions: int, max_bytes: int, root: str = ROOT) -> None:
        self.max_regions = max_regions
        self.max_bytes = max_bytes
        self.root = root
        self._regions: dict[str, _Region] = {}
        self.registered_bytes = 0

    def __len__(self) -> int:
        return len(self._regions)

    # -- register, unregister, status ---------------------------------------------------------

    def register(self, *, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map `byte_size` bytes at `offset` of the object `key` as region `name`."""
        _check_name(name)
        path = self._path_of(key, name)
        if type(offset) is not int or offset < 0:
            raise InvalidInput(f"shared memory region '{name}': offset must be a non-negative "
                               f"integer, got {offset!r}")
        if type(byte_size) is not int or byte_size <= 0:
            raise InvalidInput(f"shared memory region '{name}': byte_size must be a positive "
                               f"integer, got {byte_size!r}")
        if name in self._regions:
            raise InvalidInput(f"shared memory region '{name}' is already registered: "
                               "unregister it first, or register under another name")
        if len(self._regions) >= self.max_regions:
            raise InvalidInput(
                f"shared memory region '{name}': this server holds {len(self._regions)} "
                f"regions, its limit (MMC_SHM_MAX_REGIONS={self.max_regions}); unregister one")
        if self.registered_bytes + byte_size > self.max_bytes:
            raise InvalidInput(
                f"shared memory region '{name}': byte_size {byte_size} would take the server's "
                f"registered regions to {self.registered_bytes + byte_size} bytes, over its "
                f"limit (MMC_SHM_MAX_BYTES={self.max_bytes})")
        mapping, start = _map(path, key, name, offset, byte_size)
        self._regions[name] = _Region(name, key, offset, byte_size, mapping, start)
        self.registered_bytes += byte_size

    def unregister(self, name: str) -> None:
        region = self._regions.pop(name, None)
        if region is None:
            raise self._unknown(name)
        self._release(region)

    def unregister_all(self) -> None:
        for name in list(self._regions):
            self._release(self._regions.pop(name))

    def close(self) -> None:
        """Shutdown: every region released."""
        self.unregister_all()

    def status(self, name: str | None = None) -> list[dict]:
        """Every region (name None), or the one named: name, key, offset, byte_size."""
        if name is None:
            return [region.status() for region in self._regions.values()]
        region = self._regions.get(name)
        if region is None:
            raise self._unknown(name)
        return [region.status()]

    # -- tensors ------------------------------------------------------------------------------

    def attach(self, request: InferRequest) -> list[tuple[str, SharedMemoryPlace, np.ndarray]]:
        """Before the run: every input in shared memory becomes a read-only view of its bytes
        (BYTES elements are split out: a copy), and every output to be written there is checked
        and returned with the bytes it goes to, as (name, place, target)."""
        for tensor in request.inputs:
            place = tensor.place
            if place is not None:
                what = f"input '{tensor.name}'"
                region = self._region_for(place, what)
                tensor.array = _read(region, place, tensor.name, tensor.datatype, tensor.shape)
        targets = []
        for output in request.outputs or ():
            place = output.place
            if place is not None:
                region = self._region_for(place, f"output '{output.name}'")
                target = np.frombuffer(region.mapping, np.uint8, place.byte_size,
                                       region.start + place.offset)
                targets.append((output.name, place, target))
        return targets

    def _region_for(self, place: SharedMemoryPlace, what: str) -> _Region:
        """The region `place` names, once its bytes lie inside the region and the region still
        inside its object (a client that shrank the object would make a read fault)."""
        region = self._regions.get(place.region)
        if region is None:
            raise InvalidInput(f"{what}: {self._unknown(place.region).message}")
        if place.offset + place.byte_size > region.byte_size:
            raise InvalidInput(
                f"{what}: shared_memory_offset {place.offset} + shared_memory_byte_size "
                f"{place.byte_size} is past the end of shared memory region '{region.name}' "
                f"({region.byte_size} bytes)")
        size = region.mapping.size()  # the object's size now (fstat)
        if size < region.offset + region.byte_size:
            raise InvalidInput(
                f"{what}: shared memory region '{region.name}' no longer fits its object "
                f"'{region.key}' ({size} bytes now, the region ends at byte "
                f"{region.offset + region.byte_size}); unregister it and register it again")
        return region

    # -- helpers ------------------------------------------------------------------------------

    def _path_of(self, key: str, name: str) -> str:
        """/dev/shm/<name> for the POSIX key `/<name>`: one leading slash, one file name."""
        if type(key) is not str or not key.startswith("/") or len(key) < 2:
            raise InvalidInput(f"shared memory region '{name}': key {key!r} is not a POSIX "
                               "shared-memory name: one leading '/' and then a name ('/in0')")
        base = key[1:]
        if "/" in base or "\0" in base or base in (".", "..") or len(base) > MAX_NAME_CHARS:
            raise InvalidInput(f"shared memory region '{name}': key {key!r} must name one "
                               f"object under {self.root}: no further '/', not '.' or '..', at "
                               f"most {MAX_NAME_CHARS} characters")
        return os.path.join(self.root, base)

    def _unknown(self, name: str) -> InvalidInput:
        return InvalidInput(f"no shared memory region '{name}' is registered"
                            + (f" (registered: {', '.join(sorted(self._regions))})"
                               if self._regions else ""))

    def _release(self, region: _Region) -> None:
        self.registered_bytes -= region.byte_size
        try:
            region.mapping.close()  # unmapped, its file descriptor closed
        except BufferError:
            pass  # a request in flight still reads it: released with that request's views


def write_outputs(targets: list[tuple[str, SharedMemoryPlace, np.ndarray]],
                  outputs: dict[str, np.ndarray]) -> None:
    """After the run: each output's bytes (the binary layout) into its shared-memory place."""
    for name, place, target in targets:
        array = outputs[name]
        block = binary_block(array, datatype_of(array))
        size = len(block) if isinstance(block, bytes) else block.nbytes
        if size > place.byte_size:
            raise InvalidInput(
                f"output '{name}' is {size} bytes but its shared_memory_byte_size is "
                f"{place.byte_size} (shared memory region '{place.region}')")
        target[:size] = np.frombuffer(block, np.uint8) if isinstance(block, bytes) else block


def _check_name(name: str) -> None:
    if type(name) is not str or not name:
        raise InvalidInput("a shared memory region needs a name")
    if "/" in name or "\0" in name or len(name) > MAX_NAME_CHARS:
        raise InvalidInput(f"shared memory region name {name!r}: no '/', at most "
                           f"{MAX_NAME_CHARS} characters")


def _map(path: str, key: str, name: str, offset: int, byte_size: int) -> tuple[mmap.mmap, int]:
    """The region's bytes mapped shared and writable, from the page that holds `offset`."""
    what = f"shared memory region '{name}'"
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        raise InvalidInput(f"{what}: no shared memory object with key '{key}' on this "
                           "machine (the client creates it first, with shm_open)") from None
    except OSError as exc:  # ELOOP: a symlink; EACCES: not ours to open
        raise InvalidInput(f"{what}: cannot open shared memory object '{key}': "
                           f"{exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidInput(f"{what}: '{key}' is not a shared memory object")
        if offset + byte_size > info.st_size:
            raise InvalidInput(
                f"{what}: offset {offset} + byte_size {byte_size} is past the end of shared "
                f"memory object '{key}' ({info.st_size} bytes)")
        start = offset % mmap.ALLOCATIONGRANULARITY
        try:
            mapping = mmap.mmap(fd, start + byte_size, flags=mmap.MAP_SHARED,
                                prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=offset - start)
        except OSError as exc:
            raise InvalidInput(f"{what}: cannot map '{key}': {exc.strerror}") from None
        return mapping, start
    finally:
        os.close(fd)  # the mapping keeps a descriptor of its own until it is closed


def _read(region: _Region, place: SharedMemoryPlace, name: str, datatype: str,
          shape: list[int]) -> np.ndarray:
    """Input `name` from its place: a read-only view for fixed-width datatypes."""
    count = math.prod(shape)
    at = region.start + place.offset
    if datatype == "BYTES":
        view = memoryview(region.mapping)[at:at + place.byte_size]
        try:
            return binary_bytes(view, 0, place.byte_size, count, name).reshape(shape)
        finally:
            view.release()
    dtype = DATATYPES[datatype]
    expected = count * dtype.itemsize
    if place.byte_size != expected:
        raise InvalidInput(
            f"input '{name}': shared_memory_byte_size is {place.byte_size} but shape {shape} "
            f"of {datatype} needs {expected} bytes")
    array = np.frombuffer(region.mapping, dtype, count, at).reshape(shape)
    array.flags.writeable = False
    return array
