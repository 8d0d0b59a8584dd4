#!/usr/bin/env python3
"""v2 JSON infer bodies -> numpy: the candidates for the request parser, side by side.

    .venv/bin/python bench/json_parse.py                 # best-of-N times, interleaved
    .venv/bin/python bench/json_parse.py --instructions  # + instruction counts (valgrind)

Bodies: the bench's conv input (1×3×224×224 FP32, three decimals, ~0.96 MB, flat and nested)
and its MLP input (1×64). Candidates:
- `general`: orjson.loads, then np.asarray of the Python floats (the parser before the fast path);
- `fast`: serving.http.codec.decode_infer_request as shipped (serving.http.json_numbers for
  bodies of
  16 KiB or more: simdjson straight into a numpy buffer, orjson for anything unusual);
- `orjson only`: orjson.loads alone, no numpy (the floor for any orjson-based path);
- `fromstring`: the `data` span cut out by hand and given to np.fromstring(sep=",") (no
  validation at all: shows that numpy's text parser is no shortcut).
Times on a shared machine are noisy: each row is the best of --rounds, candidates interleaved,
and the ratio is against `general` in the same run. Instruction counts (callgrind: N decodes
minus 0, so interpreter start-up cancels) do not depend on the neighbours.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from serving.http.codec import decode_infer_request  # noqa: E402


def bodies() -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    conv = np.round(rng.uniform(-1, 1, (1, 3, 224, 224)), 3)
    mlp = np.round(rng.uniform(-1, 1, (1, 64)), 3)

    def doc(x: np.ndarray, nested: bool) -> bytes:
        data = x.tolist() if nested else [round(float(v), 3) for v in x.ravel()]
        return json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                       "data": data}], "outputs": [{"name": "y"}]},
                          separators=(",", ":")).encode()

    return {"conv flat": doc(conv, False), "conv nested": doc(conv, True),
            "mlp flat": doc(mlp, False)}


def general(body: bytes) -> np.ndarray:
    return decode_infer_request(body, fast_json_min_bytes=None).inputs[0].array


def fast(body: bytes) -> np.ndarray:
    return decode_infer_request(body).inputs[0].array


def orjson_only(body: bytes) -> object:
    return orjson.loads(body)


def fromstring(body: bytes) -> np.ndarray:
    start = body.index(b'"data":[') + 8
    return np.fromstring(body[start:body.index(b"]", start)], dtype=np.float64, sep=",")


CANDIDATES = {"general": general, "fast": fast, "orjson only": orjson_only,
              "fromstring": fromstring}


def timings(rounds: int) -> dict[tuple[str, str], float]:
    best: dict[tuple[str, str], float] = {}
    for name, body in bodies().items():
        calls = 20 if len(body) > 100_000 else 2000
        for _ in range(rounds):
            for cand, fn in CANDIDATES.items():
                if cand == "fromstring" and "nested" in name:
                    continue
                fn(body)
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn(body)
                per = (time.perf_counter() - t0) / calls
                key = (name, cand)
                best[key] = min(best.get(key, per), per)
    return best


def instructions(body_name: str, cand: str, calls: int) -> int:
    """Instructions callgrind counts for `calls` decodes in a fresh interpreter."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                        sys.executable, __file__, "--one", body_name, cand, str(calls)],
                       check=True, capture_output=True, env={**os.environ, "PYTHONHASHSEED": "0"})
        text = out.read_text()
    m = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
    return int(m.group(1)) if m else 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--instructions", action="store_true",
                   help="also count instructions under valgrind (slow: ~1 min)")
    p.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:  # the process callgrind watches
        body_name, cand, calls = a.one
        body = bodies()[body_name]
        for _ in range(int(calls)):
            CANDIDATES[cand](body)
        return
    sizes = {k: len(v) for k, v in bodies().items()}
    best = timings(a.rounds)
    print(f"load average {' '.join(os.getloadavg().__str__().strip('()').split(', '))}")
    print("| body | bytes | candidate | best ms | vs general |")
    print("|---|---:|---|---:|---:|")
    for (name, cand), t in best.items():
        print(f"| {name} | {sizes[name]:,} | {cand} | {t * 1e3:.3f} | "
              f"{best[(name, 'general')] / t:.2f}× |")
    if a.instructions:
        print("\n| body | candidate | instructions per decode | vs general |")
        print("|---|---|---:|---:|")
        for name in ("conv flat", "mlp flat"):
            calls = 5 if name.startswith("conv") else 200
            per = {}
            for cand in ("general", "fast"):
                base = instructions(name, cand, 0)
                per[cand] = (instructions(name, cand, calls) - base) / calls
                print(f"| {name} | {cand} | {per[cand]:,.0f} | "
                      f"{per['general'] / per[cand]:.2f}× |", flush=True)


if __name__ == "__main__":
    main()
