"""One datatype table: the codec's inverse, warm-up inputs and the try-it snippets all derive
from serving.core.dtypes.DATATYPES, so a datatype is added (or BF16 support appears) in one
place."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from serving.core.dtypes import (
    DATATYPE_BY_DTYPE,
    DATATYPES,
    NOT_IN_NUMPY,
    NUMPY_DTYPES,
    NUMPY_TYPE_NAMES,
)
from serving.http import codec


def test_every_datatype_but_bytes_maps_back_to_itself():
    for name, dtype in DATATYPES.items():
        if name != "BYTES":
            assert DATATYPE_BY_DTYPE[dtype] == name
            assert codec.datatype_of(np.zeros(1, dtype)) == name
    assert codec.datatype_of(np.array([b"x"], dtype=object)) == "BYTES"


def test_bf16_comes_from_ml_dtypes_and_stays_out_of_the_numpy_only_tables():
    assert DATATYPES["BF16"] == np.dtype(ml_dtypes.bfloat16)
    assert "BF16" in NOT_IN_NUMPY
    assert "BF16" not in NUMPY_DTYPES and "BF16" not in NUMPY_TYPE_NAMES


def test_the_codec_keeps_exporting_the_table():
    assert codec.DATATYPES is DATATYPES


def test_snippet_type_names_are_numpy_attributes_that_work_on_numpy_1_and_2():
    assert NUMPY_TYPE_NAMES == {
        "BOOL": "bool_", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32",
        "UINT64": "uint64", "INT8": "int8", "INT16": "int16", "INT32": "int32",
        "INT64": "int64", "FP16": "float16", "FP32": "float32", "FP64": "float64",
        "BYTES": "object_",
    }
    for name, attr in NUMPY_TYPE_NAMES.items():
        assert np.dtype(getattr(np, attr)) == NUMPY_DTYPES[name]
