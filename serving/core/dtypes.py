"""The v2 datatype ⇄ numpy dtype table, written once; every other mapping is derived from it
(MLServer's codecs/numpy.py idea): the codec's inverse, warm-up inputs, the try-it snippets."""

from __future__ import annotations

import numpy as np

try:  # BF16 has no numpy type; ml_dtypes provides one (binary only on the wire).
    from ml_dtypes import bfloat16 as _bfloat16
except ImportError:  # pragma: no cover - exercised only where ml_dtypes is absent
    _bfloat16 = None

#: v2 datatype -> numpy dtype (explicitly little-endian, as the binary extension is).
#: BYTES maps to object: elements are Python bytes. BF16 is there where ml_dtypes is installed.
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
if _bfloat16 is not None:
    DATATYPES["BF16"] = np.dtype(_bfloat16)

#: Datatypes numpy itself has no type for: they travel as binary data only, and neither warm-up
#: inputs nor a numpy snippet can be made for them.
NOT_IN_NUMPY = frozenset({"BF16"})

#: numpy dtype -> v2 datatype, for arrays a runtime produced (object arrays are BYTES by kind).
DATATYPE_BY_DTYPE: dict[np.dtype, str] = {
    dt: name for name, dt in DATATYPES.items() if name != "BYTES"
}

#: v2 datatype -> numpy dtype, for the datatypes numpy has a type of its own for.
NUMPY_DTYPES: dict[str, np.dtype] = {
    name: dt for name, dt in DATATYPES.items() if name not in NOT_IN_NUMPY
}


def _type_name(dtype: np.dtype) -> str:
    # `np.bool_` works on numpy 1 and 2 (`np.bool` only on 2), so a copied snippet runs anywhere.
    return "bool_" if dtype.kind == "b" else dtype.type.__name__


#: v2 datatype -> the numpy attribute naming its type, for code a user copies (`np.<name>`).
NUMPY_TYPE_NAMES: dict[str, str] = {name: _type_name(dt) for name, dt in NUMPY_DTYPES.items()}
