"""The version page: signature, validation report, lineage, serving settings, try-it."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from registry import selectors

from .. import tryit
from .access import requires
from .models import found

SERVING_FIELDS = ("max_batch_size", "preferred_batch_sizes", "max_queue_delay_us",
                  "max_queue_size", "instance_count", "intra_op_threads",
                  "graph_optimization_level")


@require_GET
@requires("viewer")
def version_detail(request: HttpRequest, name: str, number: int) -> HttpResponse:
    version = found(selectors.version_get, name, number)
    signature = version.signature or {}
    inputs = tryit.example_inputs(signature)
    outputs = signature.get("outputs") or []
    base = request.build_absolute_uri("/")
    context = {
        "model": version.model, "version": version, "signature": signature,
        "inputs": inputs, "outputs": outputs,
        "report": version.validation_report or {},
        "serving": [(f, getattr(version, f)) for f in SERVING_FIELDS],
        "infer_url": f"/v2/models/{name}/versions/{number}/infer",
        "curl": tryit.curl_snippet(base, name, number, inputs),
        "tritonclient": tryit.tritonclient_snippet(request.get_host(), name, number, inputs,
                                                   outputs),
    }
    return render(request, "console/version_detail.html", context)
