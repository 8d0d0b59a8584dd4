"""Convert a version the installed onnxruntime cannot load (IR version or opset too new, as
today's exporters write) into a new version it loads, proven equivalent before it is kept.

Runs in the request, not as a background task: whoever asks (CI after `mmc upload --convert`, an
engineer on the version page) wants the new version or the reason it was refused in the answer,
and for the models this serves (onnx's version converter plus two inferences on two generated
rows) that takes milliseconds to a few seconds. Artifacts over CONVERT_MAX_BYTES are refused,
since onnx's pure-numpy reference evaluator would hold a request too long on a large model, and
the equivalence check runs in a child process under memory and time limits (registry/
equivalence.py), since a small file can still ask for any amount of either. The new version is
then validated in the background like any upload.
"""

from __future__ import annotations

import copy
import re
import time
from dataclasses import dataclass

import onnx
import onnxruntime as ort
from django.conf import settings
from django.db import transaction
from google.protobuf.message import DecodeError
from onnx import version_converter

from registry.audit import Actor, record
from registry.equivalence import SEED, compare_in_box
from registry.errors import ConversionRefused, LifecycleError, PayloadTooLarge, without_paths
from registry.models import ModelVersion
from registry.selectors import version_get
from registry.services.versions import version_upload
from registry.signatures import default_opset, runtime_too_new
from registry.store.artifacts import ArtifactUnavailable, default_store


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
    compared = compare_in_box(model.SerializeToString(), data, rtol=rtol, atol=atol, seed=seed,
                              memory_bytes=settings.CONVERT_MEMORY_BYTES,
                              timeout_s=settings.CONVERT_TIMEOUT_S)
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
    try:
        conversion = convert_model(model, ir_version=too_new["max_ir_version"],
                                   opset=too_new["max_opset"], rtol=settings.CONVERT_RTOL,
                                   atol=settings.CONVERT_ATOL)
    except ConversionRefused as exc:  # a reason is shown to users: no paths of this host
        raise ConversionRefused(without_paths(exc.message, settings.ARTIFACT_ROOT)) from None
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
