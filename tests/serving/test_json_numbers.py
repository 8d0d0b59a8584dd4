"""Large v2 JSON bodies: numeric `data` is read straight into numpy (serving.http.json_numbers), and
the result is exactly what the general parser (orjson, then numpy) gives, errors included."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving.core.errors import InvalidInput
from serving.http import json_numbers
from serving.http.codec import decode_infer_request

FAST = {"fast_json_min_bytes": 0}  # every body tries the fast path first
GENERAL = {"fast_json_min_bytes": None}  # orjson only, as before the fast path
NUMERIC = ["FP16", "FP32", "FP64", "INT8", "INT16", "INT32", "INT64",
           "UINT8", "UINT16", "UINT32", "UINT64"]
BOUNDED = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def outcome(body: bytes, options: dict) -> tuple:
    """Everything a caller can see of one decode: the request, bit for bit, or the 400 text."""
    try:
        req = decode_infer_request(body, **options)
    except InvalidInput as exc:
        return ("400", str(exc))
    tensors = [(t.name, t.datatype, t.shape, t.parameters, t.array.dtype.str, t.array.shape,
                t.array.tobytes() if t.array.dtype != object else t.array.tolist())
               for t in req.inputs]
    return ("ok", req.id, req.parameters, req.binary_output, req.outputs, tensors)


def assert_same_as_general(body: bytes) -> None:
    assert outcome(body, FAST) == outcome(body, GENERAL)


def conv_body(nested: bool = False) -> tuple[bytes, np.ndarray]:
    x = np.round(np.random.default_rng(0).uniform(-1, 1, (1, 3, 224, 224)), 3)
    data = x.tolist() if nested else x.ravel().tolist()
    body = orjson.dumps({"id": "r1", "inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 3, 224, 224], "data": data}],
        "outputs": [{"name": "y", "parameters": {"binary_data": False}}]})
    return body, x.astype(np.float32)


# ------------------------------------------------------------------ what users send


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested row-major"])
def test_a_conv_sized_json_body_reads_its_numbers_without_python_floats(nested):
    body, x = conv_body(nested)
    doc = json_numbers.load(body)
    assert type(doc["inputs"][0]["data"]) is json_numbers.Numbers
    req = decode_infer_request(body)
    assert req.inputs[0].array.dtype == np.float32
    assert req.inputs[0].array.tobytes() == x.tobytes()
    assert req.id == "r1" and req.outputs[0].name == "y" and req.outputs[0].binary is False
    assert_same_as_general(body)


def test_integer_data_for_a_float_tensor_rounds_as_the_general_parser_does():
    big = [2**53 + 1, 2**60 + 3, -(2**62) - 1, 16777217, 1, 0]  # where int->f64->f32 could differ
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [6000],
                                     "data": big * 1000}]})
    assert_same_as_general(body)
    assert decode_infer_request(body).inputs[0].array[0] == np.float32(2**53 + 1)


@pytest.mark.parametrize("bad, message", [
    (b'"1"', "holds strings"),
    (b"null", "mixed or null values"),
    (b"1.5", "not INT32 values|non-integer"),
    (b"01", "not valid JSON"),
    (b"1.", "not valid JSON"),
    (b"+1", "not valid JSON"),
    (b"NaN", "not valid JSON"),
    (b"1e400", "not valid JSON"),
    (b"[1]", "not a regular array"),
    (b"3000000000", "out of range"),
])
def test_one_bad_number_in_a_large_body_is_the_same_400_as_before(bad, message):
    good = b",".join(b"%d" % (i % 100) for i in range(20000))
    body = (b'{"inputs":[{"name":"x","datatype":"INT32","shape":[20001],"data":['
            + good + b"," + bad + b"]}]}")
    with pytest.raises(InvalidInput, match=message):
        decode_infer_request(body)
    assert_same_as_general(body)


@pytest.mark.parametrize("body", [
    b'\xef\xbb\xbf{"inputs":[{"name":"x","datatype":"FP32","shape":[2],"data":[1,2]}]}',
    b'{"inputs":[{"name":"x","datatype":"FP32","shape":[3],"data":[[1,2],[3]]}]}',
    b'{"inputs":[{"name":"x","datatype":"FP32","shape":[2],"data":[1,[2]]}]}',
    b'{"inputs":[{"name":"x","datatype":"FP32","shape":[2],"data":[[1],2]}]}',
    b'{"inputs":[{"name":"x","datatype":"FP32","shape":[2],"data":[1,2],"data":[1,2,3]}]}',
    b'{"inputs":[{"name":"x","datatype":"FP32","shape":[0],"data":[]}]}',
    b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,0],"data":[[]]}]}',
    b'{"inputs":[{"name":"x[0]","datatype":"FP32","shape":[2],"data":[1,2]}]}',
    b'{"inputs":[{"name":"x","datatype":"BOOL","shape":[2],"data":[true,false]}]}',
    b'{"inputs":[{"name":"x","datatype":"BYTES","shape":[1],"data":["a"]}]}',
    b'{"inputs":[{"name":"x","datatype":"FP32","shape":[2],"data":[true,1.5]}]}',
    b'{"inputs":[{"name":"x","datatype":"UINT64","shape":[1],"data":[18446744073709551615]}]}',
    b'{"inputs":[{"name":"x","datatype":"INT64","shape":[1],"data":[-9223372036854775809]}]}',
    b'{"inputs":[{"name":"x","datatype":"FP32","shape":[2],"data":[-0,-0.0]}]}',
    b'{"inputs":[{"name":"x","datatype":"FP32","shape":[2],"data":[1,2]}]} x',
    b'{"inputs":[{"name":"x","datatype":"FP32","shape":[2],"data":[1,2]}],"inputs":[]}',
    b'{"inputs":[{"name":"x","datatype":"FP32","shape":[2],"data":[1,2]}],"outputs":[[]]}',
    b'{"inputs":[{"name":"\\ud800","datatype":"FP32","shape":[2],"data":[1,2]}]}',
    b'{"inputs":[{"name":"x","datatype":"FP32","shape":[2],"data":{"a":1}}]}',
    b'[{"name":"x","datatype":"FP32","shape":[2],"data":[1,2]}]',
], ids=lambda b: b.decode("utf-8", "replace")[:60])
def test_unusual_bodies_get_the_general_parsers_answer(body):
    assert_same_as_general(body)


# ------------------------------------------------------------------ random bodies

JSON_FLOATS = (st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**60), 2**60)
               | st.integers(-(2**70), 2**70))
ODD_INTS = st.integers(-(2**64), 2**65) | st.floats(-1e3, 1e3, allow_nan=False) | st.booleans()


def in_range(datatype: str) -> st.SearchStrategy:
    info = np.iinfo(np.dtype(datatype.lower().replace("fp", "float")))
    return st.integers(int(info.min), int(info.max))


@st.composite
def tensor(draw, name: str) -> dict:
    """Mostly what a client sends (so the fast path runs), sometimes what it should not."""
    datatype = draw(st.sampled_from(NUMERIC) if draw(st.integers(0, 19))
                    else st.sampled_from(["BOOL", "BYTES"]))
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    count = int(np.prod(shape))
    if datatype == "BOOL":
        element = st.booleans()
    elif datatype == "BYTES":
        element = st.text(max_size=3)
    elif datatype.startswith("FP"):
        element = JSON_FLOATS if draw(st.integers(0, 3)) else st.integers(-300, 70000)
    else:
        element = in_range(datatype) if draw(st.integers(0, 3)) else ODD_INTS
    extra = 0 if draw(st.integers(0, 9)) else 1
    values = draw(st.lists(element, min_size=count + extra, max_size=count + extra))
    data: list = values
    if not extra and draw(st.booleans()):  # the nested row-major form
        data = np.array(values, dtype=object).reshape(shape).tolist()
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


@st.composite
def body(draw) -> bytes:
    names = draw(st.lists(st.sampled_from(["x", "y", "é"] if draw(st.integers(0, 9))
                                          else ["x", "x[1]"]), min_size=1, max_size=3,
                           unique=draw(st.integers(0, 9)) > 0))
    doc: dict = {"inputs": [draw(tensor(n)) for n in names]}
    if draw(st.booleans()):
        doc["id"] = draw(st.text(max_size=5))
    if draw(st.booleans()):
        doc["parameters"] = draw(st.dictionaries(
            st.sampled_from(["a", "binary_data_output", "tags"]),
            st.booleans() | st.integers() | st.lists(st.integers(), max_size=2), max_size=2))
    if draw(st.booleans()):
        doc["outputs"] = [{"name": "y", "parameters": {"binary_data": draw(st.booleans())}}]
    # the standard library writes integers of any size, and \u escapes when ensure_ascii
    text = json.dumps(doc, ensure_ascii=draw(st.booleans()), separators=(",", ":")).encode()
    if draw(st.booleans()):  # whitespace where JSON allows it
        text = text.replace(b",", draw(st.sampled_from([b", ", b",\n", b"\t,\r "])))
    return text


@BOUNDED
@given(body())
def test_random_bodies_decode_exactly_as_the_general_parser_decodes_them(raw):
    assert_same_as_general(raw)


@BOUNDED
@given(body(), st.lists(st.tuples(
    st.integers(0, 10**6), st.sampled_from(["replace", "insert", "delete"]),
    st.sampled_from(list(b'[]{},:"-+.eE01 \\x\xff\t'))), min_size=1, max_size=3))
def test_damaged_bodies_are_refused_or_accepted_exactly_as_the_general_parser_does(raw, edits):
    damaged = bytearray(raw)
    for position, edit, byte in edits:
        i = position % (len(damaged) + 1)
        if edit == "insert":
            damaged.insert(i, byte)
        elif i < len(damaged):
            if edit == "replace":
                damaged[i] = byte
            else:
                del damaged[i]
    assert_same_as_general(bytes(damaged))
