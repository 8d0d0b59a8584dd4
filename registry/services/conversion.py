"""Convert a version the installed onnxruntime cannot load (IR version or opset too new, as
today's exporters write) into a new version it loads, proven equivalent before it is kept.

Runs in the request, not as a background task: whoever asks (CI after `mmc upload --convert`, an
engineer on the version page) wants the new version or the reason it was refused in the answer,
and for the models this serves (onnx's version converter plus two inferences on two generated
rows) that takes milliseconds to a few seconds. Artifacts over CONVERT_MAX_BYTES are refused,
since onnx's pure-numpy reference evaluator would hold a request too long on a large model. The
new version is then validated in the background like any upload.
"""

from __future__ import annotations

import copy
import re
import time
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
from django.conf import settings
from django.db import transaction
from google.protobuf.message import DecodeError
from onnx import version_converter
from onnx.reference import ReferenceEvaluator

from registry.audit import Actor, record
from registry.errors import ConversionRefused, LifecycleError, PayloadTooLarge
from registry.models import ModelVersion
from registry.selectors import version_get
from registry.services.versions import version_upload
from registry.signatures import default_opset, extract_signature, runtime_too_new
from registry.store.artifacts import ArtifactUnavailable, default_store
from serving.dtypes import NUMPY_DTYPES

#: Generated inputs: a fixed seed, so a refusal or a max abs diff can be reproduced.
SEED = 0
#: A dynamic first dimension gets this many rows (more than one, so batching is exercised too).
ROWS = 2


@dataclass(frozen=True)
class Conversion:
    data: bytes  # the converted model, serialized
    record: dict  # from/to, tolerance, max abs diff...: stored on the new version and audited


def convert_model(model: onnx.ModelProto, *, ir_version: int, opset: int, rtol: float,
                  atol: float, seed: int = SEED) -> Conversion:
    """`model` converted down to (ir_version, opset) with onnx's version converter, and its
    outputs on generated inputs compared: the original run by onnx's reference evaluator, the
    converted one by onnxruntime. ConversionRefused says why when either step fails."""
    started = time.perf_counter()
    source_ir, source_opset = int(model.ir_version), default_opset(model)
    to_opset = min(source_opset, opset) if source_opset is not None else None
    if source_opset is not None and source_opset > opset:
        try:
            converted = version_converter.convert_version(model, opset)
        except Exception as exc:  # the converter raises RuntimeError/ValueError from C++
            raise ConversionRefused(_converter_reason(exc, source_opset, opset)) from None
    else:
        converted = copy.deepcopy(model)
    converted.ir_version = min(source_ir, ir_version)
    try:
        onnx.checker.check_model(converted, full_check=True)
    except Exception as exc:  # checker raises several unrelated types
        raise ConversionRefused(f"the converted model (IR {converted.ir_version}, opset "
                                f"{to_opset}) fails the ONNX checker: {exc}") from None
    data = converted.SerializeToString()
    compared = compare(model, data, rtol=rtol, atol=atol, seed=seed)
    return Conversion(data=data, record={
        "from": {"ir_version": source_ir, "opset": source_opset},
        "to": {"ir_version": int(converted.ir_version), "opset": to_opset},
        "tolerance": {"rtol": rtol, "atol": atol},
        **compared,
        "converter": f"onnx.version_converter (onnx {onnx.__version__})",
        "seconds": round(time.perf_counter() - started, 3),
    })


def _converter_reason(exc: Exception, source: int, target: int) -> str:
    text = str(exc)
    if match := re.search(r"No Previous Version of (\S+) exists", text):
        return (f"operator {match.group(1)} cannot be converted down to opset {target}: it "
                f"first appears in a later opset (the model imports opset {source}) and has no "
                f"earlier version, so no adapter exists; export the model without it, or serve "
                f"it with an onnxruntime that loads opset {source}")
    if match := re.search(r"No Adapter (?:From|For) (\S+)", text):
        return (f"operator {match.group(1)} has no adapter from opset {source} down to "
                f"{target} in onnx's version converter; export the model at opset {target}")
    last = text.strip().splitlines()[-1] if text.strip() else exc.__class__.__name__
    return f"onnx's version converter could not convert opset {source} to {target}: {last}"


def equivalence_inputs(signature: dict, seed: int = SEED) -> dict[str, np.ndarray]:
    """Deterministic inputs for a signature: normal floats, 0/1 integers and booleans (safe as
    indices), "x" strings; a dynamic first dimension is ROWS, other dynamic ones 1."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in signature["inputs"]:
        shape = spec["shape"] if spec["shape"] is not None else [-1]
        dims = [d if d >= 0 else (ROWS if i == 0 else 1) for i, d in enumerate(shape)]
        datatype = spec["datatype"]
        if datatype == "BYTES":
            feeds[spec["name"]] = np.full(dims, "x", dtype=object)
            continue
        dtype = NUMPY_DTYPES.get(datatype)
        if dtype is None:
            raise ConversionRefused(f"input {spec['name']!r}: no inputs can be generated for "
                                    f"datatype {datatype}, so equivalence cannot be proven")
        if dtype.kind == "f":
            feeds[spec["name"]] = rng.standard_normal(dims).astype(dtype)
        else:
            feeds[spec["name"]] = rng.integers(0, 2, dims).astype(dtype)
    return feeds


def compare(original: onnx.ModelProto, converted: bytes, *, rtol: float, atol: float,
            seed: int = SEED) -> dict:
    """Run both on the same generated inputs; refuse when any output differs beyond
    |converted - original| <= atol + rtol * |original| (exact for non-float outputs)."""
    try:
        signature = extract_signature(original)
    except ValueError as exc:
        raise ConversionRefused(f"unsupported signature: {exc}") from None
    feeds = equivalence_inputs(signature, seed)
    try:
        expected = ReferenceEvaluator(original).run(None, feeds)
    except Exception as exc:  # an operator the reference evaluator does not implement, ...
        raise ConversionRefused(f"onnx's reference evaluator could not run the original model, "
                                f"so equivalence cannot be proven: {exc}") from None
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(converted, options, providers=["CPUExecutionProvider"])
        actual = session.run(None, feeds)
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
        raise ConversionRefused(f"onnxruntime {ort.__version__} could not run the converted "
                                f"model: {exc}") from None
    diffs = {}
    for spec, want, got in zip(signature["outputs"], expected, actual, strict=True):
        name, want, got = spec["name"], np.asarray(want), np.asarray(got)
        if want.shape != got.shape:
            raise ConversionRefused(f"output {name!r} of the converted model has shape "
                                    f"{list(got.shape)}, the original's {list(want.shape)}")
        if want.dtype.kind in "fc":
            diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
            diffs[name] = float(np.nanmax(diff)) if diff.size and not np.isnan(diff).all() else 0.0
            ok = np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
        else:
            ok = np.array_equal(got, want)
            diffs[name] = 0.0 if ok else None
        if not ok:
            shown = "values differ" if diffs[name] is None else f"max abs diff {diffs[name]:.3g}"
            raise ConversionRefused(
                f"output {name!r} of the converted model differs from the original's "
                f"({shown}; tolerance rtol={rtol:g}, atol={atol:g}) on generated inputs (seed "
                f"{seed}): the conversion was not kept")
    found = [d for d in diffs.values() if d is not None]
    return {"max_abs_diff": max(found, default=0.0), "outputs": diffs,
            "inputs": {name: list(a.shape) for name, a in feeds.items()}, "seed": seed,
            "reference": f"onnx.reference.ReferenceEvaluator (onnx {onnx.__version__})",
            "runtime": f"onnxruntime {ort.__version__} (CPUExecutionProvider)"}


def version_convert(*, model_name: str, number: int,
                    actor: Actor) -> tuple[ModelVersion, bool]:
    """Convert version `number` to the highest IR version and opset the installed onnxruntime
    loads, as the model's next version with its lineage in the metadata (converted_from,
    converted_by, conversion) and in the audit log, then validate it like any upload.

    Returns (version, created): converting the same version again finds the same bytes, so it
    answers the version made the first time."""
    source = version_get(model_name, number)
    if source.model.archived:
        raise LifecycleError(f"model {model_name!r} is archived; unarchive it first")
    limit = settings.CONVERT_MAX_BYTES
    if source.size_bytes > limit:
        raise PayloadTooLarge(f"version {number} is {source.size_bytes} bytes, over the "
                              f"{limit} bytes converted in a request (MMC_CONVERT_MAX_BYTES); "
                              f"convert it with onnx.version_converter and upload the result",
                              field="version")
    try:
        path = default_store().local_path(source.sha256)
    except ArtifactUnavailable:
        raise LifecycleError(f"the artifact of version {number} is missing from the "
                             f"store") from None
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError):
        raise ConversionRefused(f"version {number} is not an ONNX model; there is nothing to "
                                f"convert") from None
    too_new = runtime_too_new(model)
    if too_new is None:
        raise LifecycleError(f"version {number} (IR {model.ir_version}, opset "
                             f"{default_opset(model)}) loads on onnxruntime {ort.__version__} "
                             f"as it is: there is nothing to convert", field="version")
    conversion = convert_model(model, ir_version=too_new["max_ir_version"],
                               opset=too_new["max_opset"], rtol=settings.CONVERT_RTOL,
                               atol=settings.CONVERT_ATOL)
    blob = default_store().save_bytes(conversion.data)
    to = conversion.record["to"]
    stem = (source.original_filename or f"{model_name}-v{number}.onnx").removesuffix(".onnx")
    metadata = {**(source.metadata or {}), "converted_from": number,
                "converted_by": actor.name, "conversion": conversion.record}
    with transaction.atomic():
        version, created = version_upload(
            model_name=model_name, blob=blob, actor=actor, metadata=metadata,
            filename=f"{stem}-ir{to['ir_version']}-opset{to['opset']}.onnx")
        if created:
            record(actor, "version.convert", target_type="version", target=str(version),
                   model_name=model_name,
                   before={"version": number, **conversion.record["from"]},
                   after={"version": version.number, **conversion.record})
    return version, created
