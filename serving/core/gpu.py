"""Whether this host has a usable CUDA device: asked of the driver alone (ctypes, os), so a
process that only decides how many workers to start (serving.process.supervisor) loads neither
numpy nor onnxruntime to know."""

from __future__ import annotations

import ctypes
import functools
import os


@functools.cache
def gpu_available() -> bool:
    """Whether a CUDA device is really usable, asked of the driver (libcuda), once per process.

    onnxruntime-gpu lists CUDA/TensorRT providers whether or not a GPU exists, so its list is
    no evidence. Note: cuInit initialises the driver in this process; CUDA does not survive a
    fork, so call this after forking worker processes, not before.
    """
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    try:
        if lib.cuInit(0) != 0:
            return False
        count = ctypes.c_int(0)
        if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return False
        return count.value > 0
    except (AttributeError, OSError):
        return False
