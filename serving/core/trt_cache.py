"""TensorRT engine cache folders, computed the same way by the build job (registry) and by every
serving replica: <root>/<sha256[:16]>/<key>, the key hashing (artifact sha256, GPU model,
TensorRT version, precision, shape profile). An engine is therefore only ever reused on the GPU,
TensorRT release and shapes it was built for; a replica on other hardware builds (and caches)
its own beside it."""

from __future__ import annotations

import ctypes
import functools
import hashlib
from pathlib import Path

from serving.core.tensor_signature import batch_dimension

PRECISIONS = ("fp32", "fp16")


@functools.cache
def gpu_model() -> str:
    """The first CUDA device's name from the driver (e.g. "NVIDIA H100 80GB HBM3")."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        if lib.cuInit(0) != 0:
            return "unknown"
        device = ctypes.c_int(0)
        if lib.cuDeviceGet(ctypes.byref(device), 0) != 0:
            return "unknown"
        name = ctypes.create_string_buffer(256)
        if lib.cuDeviceGetName(name, 256, device) != 0:
            return "unknown"
        return name.value.decode(errors="replace")
    except (OSError, AttributeError):
        return "unknown"


@functools.cache
def tensorrt_version() -> str:
    """The TensorRT library onnxruntime's provider will load (python package, else libnvinfer)."""
    try:
        import tensorrt

        return str(tensorrt.__version__)
    except ImportError:
        pass
    for soname in ("libnvinfer.so.10", "libnvinfer.so"):
        try:
            v = ctypes.CDLL(soname).getInferLibVersion()
        except (OSError, AttributeError):
            continue
        return f"{v // 10000}.{v // 100 % 100}.{v % 100}" if v >= 10000 else \
            f"{v // 1000}.{v // 100 % 10}.{v % 100}"
    return "unknown"


def shape_profile(signature: dict, max_batch_size: int) -> dict | None:
    """TensorRT optimisation profile (min/opt/max per input) covering batch 1..max_batch_size;
    None when an input has a dynamic dimension other than the batch (TensorRT then builds for
    the shapes it meets)."""
    mbs = max_batch_size if batch_dimension(signature) else 0
    shapes: dict[str, list[list[int]]] = {}
    for spec in signature.get("inputs", []):
        dims = list(spec.get("shape") or [])
        rest = dims[1:] if mbs else dims
        if any(d < 0 for d in rest):
            return None
        if mbs:
            shapes[spec["name"]] = [[1, *rest], [mbs, *rest], [mbs, *rest]]
        else:
            shapes[spec["name"]] = [rest, rest, rest]

    def fmt(i: int) -> str:
        return ",".join(f"{name}:{'x'.join(map(str, s[i]))}" for name, s in shapes.items())

    return {"trt_profile_min_shapes": fmt(0), "trt_profile_opt_shapes": fmt(1),
            "trt_profile_max_shapes": fmt(2)}


def cache_key(*, sha256: str, gpu: str, trt: str, precision: str, profile: dict | None) -> str:
    parts = [sha256, gpu, trt, precision, repr(sorted((profile or {}).items()))]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def engine_dir(root: str | Path, *, sha256: str, precision: str, signature: dict,
               max_batch_size: int) -> tuple[Path, str, dict | None]:
    """(folder, key, profile) for this machine's GPU and TensorRT."""
    profile = shape_profile(signature, max_batch_size)
    key = cache_key(sha256=sha256, gpu=gpu_model(), trt=tensorrt_version(), precision=precision,
                    profile=profile)
    return Path(root) / sha256[:16] / key, key, profile
