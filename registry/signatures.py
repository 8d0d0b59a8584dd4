"""A model version's signature as the registry learns it: its ONNX graph inputs/outputs in v2
terms, extracted once at upload and stored with the version; whether the installed onnxruntime
can load the model; and whether a candidate's signature can take the stable's traffic.

Format: {"inputs": [{"name", "datatype", "shape"}], "outputs": [...], "ir_version",
"opsets": {domain: version}, "producer": "name version"}; -1 marks a dynamic dimension and
shape None an unknown rank. Requests are checked against it by serving/core/tensor_signature.py.
"""

from __future__ import annotations

import functools
import re

import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

#: ONNX tensor element type -> v2 datatype.
ONNX_TO_V2: dict[int, str] = {
    TensorProto.BOOL: "BOOL",
    TensorProto.UINT8: "UINT8",
    TensorProto.UINT16: "UINT16",
    TensorProto.UINT32: "UINT32",
    TensorProto.UINT64: "UINT64",
    TensorProto.INT8: "INT8",
    TensorProto.INT16: "INT16",
    TensorProto.INT32: "INT32",
    TensorProto.INT64: "INT64",
    TensorProto.FLOAT16: "FP16",
    TensorProto.FLOAT: "FP32",
    TensorProto.DOUBLE: "FP64",
    TensorProto.BFLOAT16: "BF16",
    TensorProto.STRING: "BYTES",
}


# ------------------------------------------------------------------------ extraction


def extract_signature(model: onnx.ModelProto) -> dict:
    """The stored signature of an ONNX model; ValueError names any tensor the v2 protocol
    cannot carry (complex, float8, int4, sequences, maps)."""
    graph = model.graph
    initializers = {init.name for init in graph.initializer}
    inputs = [_tensor(v, "input") for v in graph.input if v.name not in initializers]
    outputs = [_tensor(v, "output") for v in graph.output]
    producer = f"{model.producer_name} {model.producer_version}".strip()
    return {
        "inputs": inputs,
        "outputs": outputs,
        "ir_version": int(model.ir_version),
        "opsets": {op.domain: int(op.version) for op in model.opset_import},
        "producer": producer,
    }


def read_signature(data: bytes) -> dict:
    """The signature of a serialized ONNX model."""
    return extract_signature(onnx.load_from_string(data))


def _tensor(value: onnx.ValueInfoProto, role: str) -> dict:
    kind = value.type.WhichOneof("value")
    if kind != "tensor_type":
        raise ValueError(
            f"{role} '{value.name}' is a {kind or 'untyped value'}, not a tensor: "
            "the v2 protocol carries tensors only"
        )
    tensor = value.type.tensor_type
    datatype = ONNX_TO_V2.get(tensor.elem_type)
    if datatype is None:
        try:
            type_name = TensorProto.DataType.Name(tensor.elem_type)
        except ValueError:
            type_name = str(tensor.elem_type)
        raise ValueError(
            f"{role} '{value.name}' has element type {type_name}, which has no v2 datatype "
            f"(supported: {', '.join(TensorProto.DataType.Name(t) for t in ONNX_TO_V2)})"
        )
    shape = None
    if tensor.HasField("shape"):
        shape = [
            d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim
        ]
    return {"name": value.name, "datatype": datatype, "shape": shape}


# --------------------------------------------------------------------- compatibility


@functools.cache
def runtime_limits() -> tuple[int, int] | None:
    """(max IR version, max default-domain opset) the installed onnxruntime loads, or None if
    unknown. Learned once per process by asking onnxruntime to load two tiny models that are
    too new and reading the limit from its refusal (no public API exposes it); ~10 ms."""
    max_ir = _probe(ort, ir_version=10_000, opset=1, pattern=r"max supported IR version: (\d+)")
    max_opset = _probe(
        ort, ir_version=7, opset=10_000, pattern=r"support for domain ai\.onnx is till opset (\d+)"
    )
    if max_ir is None or max_opset is None:
        return None
    return max_ir, max_opset


def _probe(ort, *, ir_version: int, opset: int, pattern: str) -> int | None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(
        graph, ir_version=ir_version, opset_imports=[helper.make_opsetid("", opset)]
    )
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the refusal is expected; keep it out of the logs
    try:
        ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
        match = re.search(pattern, str(exc))
        return int(match.group(1)) if match else None
    return None


def default_opset(model: onnx.ModelProto) -> int | None:
    """The model's default-domain (ai.onnx) opset, None if it imports none."""
    versions = [op.version for op in model.opset_import if op.domain in ("", "ai.onnx")]
    return max(versions) if versions else None


def runtime_too_new(model: onnx.ModelProto) -> dict | None:
    """What is too new for the installed onnxruntime, as data (the version page offers a
    conversion from it): the model's IR version and opset beside the runtime's maxima; None when
    the runtime loads both, or when its limits are unknown."""
    limits = runtime_limits()
    if limits is None:
        return None
    max_ir, max_opset = limits
    opset = default_opset(model)
    if model.ir_version <= max_ir and (opset is None or opset <= max_opset):
        return None
    return {"ir_version": int(model.ir_version), "opset": opset, "max_ir_version": max_ir,
            "max_opset": max_opset, "runtime": f"onnxruntime {ort.__version__}"}


def runtime_compatibility_problem(model: onnx.ModelProto) -> str | None:
    """Why the installed onnxruntime cannot load this model (IR version or default-domain
    opset too new), naming both numbers; None when it can, or when the limits are unknown."""
    limits = runtime_limits()
    if limits is None:
        return None
    max_ir, max_opset = limits
    runtime = f"onnxruntime {ort.__version__}"
    problems = []
    if model.ir_version > max_ir:
        problems.append(
            f"model IR version {model.ir_version} is newer than {runtime} loads "
            f"(max IR version {max_ir}); re-export with ir_version <= {max_ir}"
        )
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx") and op.version > max_opset:
            problems.append(
                f"model opset {op.version} (ai.onnx) is newer than {runtime} loads "
                f"(max opset {max_opset})"
            )
    return "; ".join(problems) or None


# ------------------------------------------------------------------------ canary diff


def signature_differences(stable: dict, candidate: dict) -> list[str]:
    """Why the candidate cannot take the stable's traffic unchanged; empty when it can.

    Inputs: every stable input must exist with the same datatype and a shape accepting all the
    stable accepts; the candidate may not require extra inputs. Outputs: every stable output
    must exist with the same datatype and shape (extra candidate outputs are harmless).
    """
    problems = []
    stable_in = {s["name"]: s for s in stable["inputs"]}
    cand_in = {s["name"]: s for s in candidate["inputs"]}
    for name, old in stable_in.items():
        new = cand_in.get(name)
        if new is None:
            problems.append(f"input '{name}' is missing from the candidate")
            continue
        if new["datatype"] != old["datatype"]:
            problems.append(
                f"input '{name}' datatype changes from {old['datatype']} to {new['datatype']}"
            )
        if not _accepts(new["shape"], old["shape"]):
            problems.append(
                f"input '{name}' shape {_fmt(new['shape'])} does not accept everything the "
                f"stable's {_fmt(old['shape'])} accepts"
            )
    for name in (n for n in cand_in if n not in stable_in):
        problems.append(f"candidate requires an extra input '{name}'")

    stable_out = {s["name"]: s for s in stable["outputs"]}
    cand_out = {s["name"]: s for s in candidate["outputs"]}
    for name, old in stable_out.items():
        new = cand_out.get(name)
        if new is None:
            problems.append(f"output '{name}' is missing from the candidate")
            continue
        if new["datatype"] != old["datatype"]:
            problems.append(
                f"output '{name}' datatype changes from {old['datatype']} to {new['datatype']}"
            )
        if new["shape"] != old["shape"]:
            problems.append(
                f"output '{name}' shape changes from {_fmt(old['shape'])} to {_fmt(new['shape'])}"
            )
    return problems


def _accepts(candidate: list[int] | None, stable: list[int] | None) -> bool:
    """Whether every shape the stable accepts is one the candidate accepts too."""
    if candidate is None:
        return True
    if stable is None or len(candidate) != len(stable):
        return False
    return all(c == -1 or c == s for c, s in zip(candidate, stable, strict=True))


def _fmt(shape: list[int] | None) -> str:
    return "any" if shape is None else str(shape)
