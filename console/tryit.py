"""Example v2 requests built from a version's signature: the try-it form's prefilled inputs and
the copy-paste curl / tritonclient snippets."""

from __future__ import annotations

import json
import math
import shlex

from serving.core.dtypes import NUMPY_TYPE_NAMES
from serving.core.tensor_signature import example_data, example_shape

#: Above this many elements an input is not prefilled (the page would be megabytes).
MAX_PREFILL = 20_000
#: Snippets carry at most this many values per input (and say so when they cut).
SNIPPET_VALUES = 256


def example_inputs(signature: dict) -> list[dict]:
    rows = []
    for tensor in signature.get("inputs") or []:
        shape = example_shape(tensor.get("shape"))
        count = math.prod(shape)
        prefilled = count <= MAX_PREFILL
        rows.append({
            "name": tensor["name"], "datatype": tensor["datatype"],
            "declared_shape": tensor.get("shape"), "shape": shape, "count": count,
            "prefilled": prefilled,
            "data_json": json.dumps(example_data(tensor["datatype"], count)) if prefilled else "[]",
        })
    return rows


def request_body(inputs: list[dict], *, max_values: int = SNIPPET_VALUES) -> dict:
    """A v2 request; long inputs are cut in the snippet (the user pastes real data anyway)."""
    body = []
    for row in inputs:
        data = example_data(row["datatype"], min(row["count"], max_values))
        body.append({"name": row["name"], "shape": row["shape"], "datatype": row["datatype"],
                     "data": data})
    return {"inputs": body}


def curl_snippet(base_url: str, model: str, number: int, inputs: list[dict]) -> str:
    url = f"{base_url.rstrip('/')}/v2/models/{model}/versions/{number}/infer"
    cut = any(row["count"] > SNIPPET_VALUES for row in inputs)
    body = json.dumps(request_body(inputs))
    lines = []
    if cut:
        lines.append(f"# data is cut to {SNIPPET_VALUES} values per input; send as many values "
                     f"as the shape holds")
    lines += [f"curl -sS -X POST {shlex.quote(url)} \\",
              "  -H 'Content-Type: application/json' \\",
              "  -H \"Authorization: Bearer $MMC_API_KEY\" \\",
              f"  -d {shlex.quote(body)}"]
    return "\n".join(lines)


def tritonclient_snippet(host: str, model: str, number: int, inputs: list[dict],
                         outputs: list[dict]) -> str:
    lines = ["import numpy as np",
             "import tritonclient.http as httpclient",
             "",
             f"client = httpclient.InferenceServerClient(url={host!r})",
             "inputs = []"]
    for row in inputs:
        dtype = NUMPY_TYPE_NAMES.get(row["datatype"], "float32")
        var = "t_" + "".join(c if c.isalnum() else "_" for c in row["name"])
        if row["datatype"] == "BYTES":
            make = f"np.array([b'example'] * {row['count']}, dtype=np.object_)"
        else:
            make = f"np.zeros({row['count']}, dtype=np.{dtype})"
        lines += [f"{var} = httpclient.InferInput({row['name']!r}, {row['shape']}, "
                  f"{row['datatype']!r})",
                  f"{var}.set_data_from_numpy({make}.reshape({row['shape']}))",
                  f"inputs.append({var})"]
    lines.append(f"result = client.infer({model!r}, inputs, model_version={str(number)!r})")
    for out in outputs:
        lines.append(f"print({out['name']!r}, result.as_numpy({out['name']!r}))")
    return "\n".join(lines)
