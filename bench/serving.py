#!/usr/bin/env python3
"""Side-by-side serving benchmark: raw onnxruntime, a bare ASGI loop, MLServer, Triton and ours.

One command, from the repository root (any Python >= 3.11; it creates its own peer environment):

    python3 bench/serving.py [--duration 10] [--only raw,bare,mlserver,triton,ours]
                             [--scenarios mlp-json-c1,mlp-json-c32,conv-bin-c8,conv-json-c8,
                                          grpc-mlp-c32,grpc-conv-c8]
                             [--modes pinned,unpinned,busy]
    python3 bench/serving.py --grpc     (only the gRPC scenarios: --scenarios grpc-mlp-c32,...)

What it does (see /work/shared/BENCH.md for the why):
- creates bench/.peers/venv (mlserver 1.7.1, nvidia-pytriton 0.7.0, onnxruntime, numpy, httptools)
  if missing, installs Debian's `wrk` if missing, then re-runs itself with that venv's Python;
- builds the sample MLP and conv models with the repo's own `registry.samples` (via .venv);
- for each server: starts it on a free loopback port (and its gRPC front on another, where it
  has one: Triton, MLServer, ours), waits for GET /v2/health/ready, checks one response of every
  scenario against onnxruntime by hand (gRPC: through tritonclient.grpc), loads it with wrk (Lua
  scripts in bench/wrk/) or, for the grpc-* scenarios, h2load (one HTTP/2 connection carrying c
  concurrent ModelInfer calls; as many calls as the server answered in --duration seconds in its
  previous run, so that none is left in flight at the end) for --duration seconds per scenario,
  records req/s, p50, p99, failed answers, stops it;
- does all of that in each mode of --modes (pinned, unpinned, busy: unpinned with a CPU-burning
  neighbour), re-pinning the running servers between modes, and records each server's CPU per
  request (its process group's user + system time over the answers);
- prints one markdown table, HTTP and gRPC rows in every mode, with ratios, and writes it to
  bench/results/serving-latest.md.

`--before DIR` adds the server "before": the same mmc-serve from another checkout of this repo
(e.g. `git worktree add /tmp/before <rev>`), run with .venv's Python and that checkout first on
PYTHONPATH, so a refactor is measured against its parent in the same run, interleaved.

"ours" is `.venv/bin/mmc-serve --model-repository DIR --host 127.0.0.1 --port PORT`; it is skipped
with a message when the command is missing or never becomes ready. Exit status 1 when a peer
fails its check or any load run sees non-2xx answers or socket errors.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
PEER_VENV = BENCH / ".peers" / "venv"
PEER_PY = PEER_VENV / "bin" / "python"
PEER_PACKAGES = ["mlserver==1.7.1", "nvidia-pytriton==0.7.0", "onnxruntime", "numpy", "httptools"]
OUR_PY = REPO / ".venv" / "bin" / "python"
OUR_SERVE = REPO / ".venv" / "bin" / "mmc-serve"
RESULTS = BENCH / "results" / "serving-latest.md"
SERVERS = ["raw", "bare", "mlserver", "triton", "ours", "before"]


@dataclass(frozen=True)
class Scenario:
    name: str
    model: str
    binary: bool
    conc: int
    title: str
    grpc: bool = False  # KServe v2 gRPC ModelInfer with raw_input_contents, loaded by h2load


SCENARIOS = {s.name: s for s in [
    Scenario("mlp-json-c1", "mlp", False, 1, "MLP 1×64, v2 JSON, c=1"),
    Scenario("mlp-json-c32", "mlp", False, 32, "MLP 1×64, v2 JSON, c=32"),
    Scenario("conv-bin-c8", "conv", True, 8, "conv 1×3×224×224, binary, c=8"),
    Scenario("conv-json-c8", "conv", False, 8, "conv 1×3×224×224, v2 JSON, c=8"),
    Scenario("grpc-mlp-c32", "mlp", True, 32, "MLP 1×64, gRPC raw_input_contents, c=32",
             grpc=True),
    Scenario("grpc-conv-c8", "conv", True, 8, "conv 1×3×224×224, gRPC raw_input_contents, c=8",
             grpc=True),
]}
SHAPES = {"mlp": (1, 64), "conv": (1, 3, 224, 224)}
MAX_BATCH = {"mlp": 32, "conv": 8}
RAW_BATCHES = {"mlp": (1, 32), "conv": (1, 8)}


def log(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------------------------
# Environment: peer venv and wrk
# --------------------------------------------------------------------------------------------

def ensure_environment() -> None:
    """Create the peer venv and install wrk when missing; then re-exec under the peer venv."""
    if not PEER_PY.exists() or subprocess.run(
            [PEER_PY, "-c", "import importlib.util as u, mlserver, onnxruntime, numpy, httptools; "
             "assert u.find_spec('pytriton')"],
            capture_output=True).returncode != 0:
        PEER_VENV.parent.mkdir(parents=True, exist_ok=True)
        logf = PEER_VENV.parent / "install.log"
        log(f"[setup] creating peer venv {PEER_VENV} ({' '.join(PEER_PACKAGES)}); log: {logf}")
        with open(logf, "w") as out:
            subprocess.run([sys.executable, "-m", "venv", PEER_VENV], check=True,
                           stdout=out, stderr=out)
            r = subprocess.run([PEER_PY, "-m", "pip", "install", *PEER_PACKAGES],
                               stdout=out, stderr=out)
        if r.returncode != 0:
            sys.exit(f"[setup] pip install failed, see {logf}")
    if shutil.which("wrk") is None:
        log("[setup] installing Debian wrk (apt-get update && apt-get install -y wrk)")
        subprocess.run(["apt-get", "update"], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["apt-get", "install", "-y", "wrk"], check=True, stdout=subprocess.DEVNULL)
    if shutil.which("h2load") is None:
        log("[setup] installing Debian nghttp2-client (h2load, the gRPC scenarios' load)")
        subprocess.run(["apt-get", "install", "-y", "nghttp2-client"], check=True,
                       stdout=subprocess.DEVNULL)
    if Path(sys.prefix).resolve() != PEER_VENV.resolve():
        os.execv(PEER_PY, [str(PEER_PY), str(Path(__file__).resolve()), *sys.argv[1:]])


# --------------------------------------------------------------------------------------------
# Models, request bodies, reference outputs (runs under the peer venv: numpy + onnxruntime)
# --------------------------------------------------------------------------------------------

def build_models(work: Path) -> dict[str, Path]:
    if not OUR_PY.exists():
        sys.exit(f"{OUR_PY} is missing: the models are built with the repo's registry.samples")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from registry.samples import mlp, "
            "conv_net; open(sys.argv[2], 'wb').write(mlp()); "
            "open(sys.argv[3], 'wb').write(conv_net())")
    paths = {"mlp": work / "mlp.onnx", "conv": work / "conv.onnx"}
    subprocess.run([OUR_PY, "-c", code, REPO, paths["mlp"], paths["conv"]], check=True)
    return paths


def session(path: Path, threads: int):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


@dataclass
class Request:
    body_file: Path
    header_len: int | None  # None: plain JSON
    reference: list[float]  # expected flat output "y"


def make_requests(work: Path, models: dict[str, Path]) -> dict[tuple[str, bool], Request]:
    import numpy as np
    rng = np.random.default_rng(0)
    out = {}
    for model, shape in SHAPES.items():
        x = np.round(rng.uniform(-1, 1, size=shape), 3).astype(np.float32)
        ref = session(models[model], 1).run(["y"], {"x": x})[0].ravel().tolist()
        inp = {"name": "x", "shape": list(shape), "datatype": "FP32"}
        outputs = [{"name": "y", "parameters": {"binary_data": False}}]
        js = json.dumps({"inputs": [{**inp, "data": [round(float(v), 3) for v in x.ravel()]}],
                         "outputs": [{"name": "y"}]}, separators=(",", ":")).encode()
        f = work / f"{model}.json.body"
        f.write_bytes(js)
        out[(model, False)] = Request(f, None, ref)
        raw = x.astype("<f4").tobytes()
        hdr = json.dumps({"inputs": [{**inp, "parameters": {"binary_data_size": len(raw)}}],
                          "outputs": outputs}, separators=(",", ":")).encode()
        f = work / f"{model}.bin.body"
        f.write_bytes(hdr + raw)
        out[(model, True)] = Request(f, len(hdr), ref)
    return out


def raw_onnxruntime(models: dict[str, Path], threads: int, cpus: str | None,
                    seconds: float = 2.0) -> dict[tuple[str, int], float]:
    """Rows/s of a tight in-process loop, pinned like the servers."""
    import numpy as np
    old = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, parse_cpus(cpus))
    res = {}
    try:
        for model, batches in RAW_BATCHES.items():
            sess = session(models[model], threads)
            for b in batches:
                x = np.random.default_rng(1).uniform(-1, 1, (b, *SHAPES[model][1:]))
                feed = {"x": x.astype(np.float32)}
                for _ in range(20):
                    sess.run(["y"], feed)
                n, t0 = 0, time.perf_counter()
                while (el := time.perf_counter() - t0) < seconds:
                    for _ in range(10):
                        sess.run(["y"], feed)
                    n += 10
                res[(model, b)] = n * b / el
                log(f"  raw onnxruntime {model} batch {b}: {res[(model, b)]:,.0f} rows/s")
    finally:
        os.sched_setaffinity(0, old)
    return res


def parse_cpus(spec: str) -> set[int]:
    cpus: set[int] = set()
    for part in spec.split(","):
        a, _, b = part.partition("-")
        cpus.update(range(int(a), int(b or a) + 1))
    return cpus


# --------------------------------------------------------------------------------------------
# Servers
# --------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Launch:
    cmd: list[str]
    env: dict[str, str] = field(default_factory=dict)
    ready_timeout: float = 60.0
    grpc_port: int | None = None  # its KServe v2 gRPC front, if it has one
    metrics_port: int | None = None  # where Triton's nv_inference_request_* counters are read


class ServerFailed(Exception):
    pass


def peer_site_packages() -> str:
    import sysconfig
    return sysconfig.get_paths()["purelib"]


def setup_bare(work: Path, models: dict[str, Path], port: int, threads: int) -> Launch:
    d = work / "bare"
    d.mkdir()
    for m, p in models.items():
        shutil.copy(p, d / f"{m}.onnx")
    return Launch([str(PEER_PY), str(BENCH / "bare_asgi.py"), "--models", str(d),
                   "--port", str(port), "--threads", str(threads)])


def setup_mlserver(work: Path, models: dict[str, Path], port: int, threads: int) -> Launch:
    d = work / "mlserver"
    d.mkdir()
    grpc_port = free_port()
    (d / "settings.json").write_text(json.dumps({
        "debug": False, "parallel_workers": 0, "host": "127.0.0.1", "http_port": port,
        "grpc_port": grpc_port, "metrics_port": free_port()}))
    for m, p in models.items():
        (d / m).mkdir()
        shutil.copy(p, d / m / "model.onnx")
        (d / m / "model-settings.json").write_text(json.dumps({
            "name": m, "implementation": "mlserver_ort.OnnxRuntimeModel",
            "parameters": {"uri": "./model.onnx", "version": "1", "extra": {"threads": threads}}}))
    return Launch([str(PEER_VENV / "bin" / "mlserver"), "start", str(d)],
                  {"PYTHONPATH": str(BENCH)}, grpc_port=grpc_port)


TRITON_MODEL_PY = '''\
import os
import sys

sys.path.insert(0, {site!r})  # the stub does not inherit PYTHONPATH

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        so = ort.SessionOptions()
        so.intra_op_num_threads = {threads}
        so.inter_op_num_threads = 1
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "x").as_numpy() for r in requests]
        y = self.sess.run(["y"], {{"x": xs[0] if len(xs) == 1 else np.concatenate(xs)}})[0]
        responses, i = [], 0
        for x in xs:
            n = x.shape[0]
            out = pb_utils.Tensor("y", np.ascontiguousarray(y[i:i + n]))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            i += n
        return responses
'''

TRITON_CONFIG = '''\
name: "{name}"
backend: "python"
max_batch_size: {max_batch}
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ {in_dims} ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 10 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: {delay} }}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
'''


def setup_triton(work: Path, models: dict[str, Path], port: int, threads: int,
                 delay_us: int) -> Launch:
    import sysconfig
    ts = Path(peer_site_packages()) / "pytriton" / "tritonserver"
    libs = Path(peer_site_packages()) / "nvidia_pytriton.libs"
    backends = work / "triton-backends"
    shutil.copytree(ts / "backends", backends)
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    shutil.copy(ts / "python_backend_stubs" / ver / "triton_python_backend_stub",
                backends / "python" / "triton_python_backend_stub")
    repo = work / "triton-models"
    for m, p in models.items():
        (repo / m / "1").mkdir(parents=True)
        shutil.copy(p, repo / m / "1" / "model.onnx")
        (repo / m / "1" / "model.py").write_text(
            TRITON_MODEL_PY.format(site=peer_site_packages(), threads=threads))
        (repo / m / "config.pbtxt").write_text(TRITON_CONFIG.format(
            name=m, max_batch=MAX_BATCH[m], in_dims=", ".join(map(str, SHAPES[m][1:])),
            delay=delay_us))
    # The stub links Debian's libpython 3.11.2 unless the interpreter's own lib folder comes
    # first; the copied stub also loses its rpath to the wheel's bundled libraries.
    ld = [sysconfig.get_config_var("LIBDIR"), str(libs), os.environ.get("LD_LIBRARY_PATH", "")]
    grpc_port, metrics_port = free_port(), free_port()
    return Launch([str(ts / "bin" / "tritonserver"), "--model-repository", str(repo),
                   "--backend-directory", str(backends), "--http-port", str(port),
                   "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port)],
                  {"LD_LIBRARY_PATH": ":".join(p for p in ld if p)}, ready_timeout=120,
                  grpc_port=grpc_port, metrics_port=metrics_port)


def setup_ours(work: Path, models: dict[str, Path], port: int, threads: int,
               checkout: Path | None = None, workers: int | None = None,
               extra_env: dict[str, str] | None = None) -> Launch:
    """Our server on a model repository; from `checkout` (another tree of this repo) if given;
    `extra_env`: settings for it (--ours-env, e.g. MMC_GRPC_TRANSPORT=fast)."""
    d = work / ("before" if checkout else "ours")
    for m, p in models.items():
        (d / m / "1").mkdir(parents=True, exist_ok=True)
        shutil.copy(p, d / m / "1" / "model.onnx")
        (d / m / "config.json").write_text(
            json.dumps({"max_batch_size": MAX_BATCH[m], "max_queue_delay_us": 0}))
    env = {"MMC_ORT_INTRA_OP_THREADS": str(threads), "MMC_ORT_INTER_OP_THREADS": "1",
           **(extra_env or {})}
    cmd = [str(OUR_SERVE)]
    if checkout:
        cmd = [str(OUR_PY), "-c", "from serving.cli import main; main()"]
        env["PYTHONPATH"] = str(checkout)
    if workers is not None:
        cmd += ["--workers", str(workers)]
    grpc_port = free_port()
    return Launch([*cmd, "--model-repository", str(d), "--host", "127.0.0.1", "--port", str(port),
                   "--grpc-port", str(grpc_port)], env, grpc_port=grpc_port, metrics_port=port)


class Running:
    def __init__(self, name: str, launch: Launch, port: int, work: Path, cpus: str | None):
        self.name, self.port = name, port
        self.grpc_port, self.metrics_port = launch.grpc_port, launch.metrics_port
        self.logfile = work / f"{name}.log"
        env = {**os.environ, "OMP_NUM_THREADS": "1", **launch.env}
        cmd = (["taskset", "-c", cpus] if cpus else []) + launch.cmd
        self.fh = open(self.logfile, "wb")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.fh, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, cwd=work)
        self.wait_ready(launch.ready_timeout)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def log_tail(self, n: int = 25) -> str:
        lines = self.logfile.read_text(errors="replace").splitlines()[-n:]
        return "\n".join("    | " + ln for ln in lines)

    def wait_ready(self, timeout: float) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                self.stop()
                raise ServerFailed(f"{self.name} exited with status {self.proc.returncode} "
                                   f"before it was ready:\n{tail}")
            try:
                with urllib.request.urlopen(self.url("/v2/health/ready"), timeout=2) as r:
                    if r.status == 200:
                        log(f"  {self.name} ready on port {self.port} after "
                            f"{time.monotonic() - t0:.1f} s")
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        tail = self.log_tail()
        self.stop()
        raise ServerFailed(f"{self.name} not ready after {timeout:.0f} s:\n{tail}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        else:  # the leader is gone; take any child still in its group with it
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.fh.close()

    def server_version(self) -> str:
        try:
            with urllib.request.urlopen(self.url("/v2"), timeout=5) as r:
                meta = json.loads(r.read())
            return f"{meta.get('name', '?')} {meta.get('version', '?')}"
        except Exception:  # noqa: BLE001 - informational only
            return "?"


# --------------------------------------------------------------------------------------------
# Checking one response by hand, loading with wrk
# --------------------------------------------------------------------------------------------

def decode_outputs(body: bytes, header_len: str | None) -> dict[str, list[float]]:
    hlen = int(header_len) if header_len else len(body)
    resp = json.loads(body[:hlen])
    out, off = {}, hlen
    for o in resp["outputs"]:
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            out[o["name"]] = list(struct.unpack(f"<{size // 4}f", body[off:off + size]))
            off += size
        else:
            data = o["data"]
            while data and isinstance(data[0], list):
                data = [v for row in data for v in row]
            out[o["name"]] = data
    return out


def check_by_hand(srv: Running, sc: Scenario, req: Request) -> None:
    headers = {"Content-Type": "application/octet-stream" if sc.binary else "application/json"}
    if req.header_len is not None:
        headers["Inference-Header-Content-Length"] = str(req.header_len)
    r = urllib.request.Request(srv.url(f"/v2/models/{sc.model}/infer"),
                               data=req.body_file.read_bytes(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(r, timeout=30) as resp:
            status, body = resp.status, resp.read()
            hlen = resp.headers.get("Inference-Header-Content-Length")
    except urllib.error.HTTPError as e:
        raise ServerFailed(f"{srv.name} {sc.name}: HTTP {e.code}: {e.read()[:500]!r}") from e
    if not 200 <= status < 300:
        raise ServerFailed(f"{srv.name} {sc.name}: HTTP {status}: {body[:500]!r}")
    try:
        y = decode_outputs(body, hlen)["y"]
    except Exception as e:
        raise ServerFailed(f"{srv.name} {sc.name}: unreadable answer {body[:300]!r}: {e}") from e
    ref = req.reference
    if len(y) != len(ref) or any(abs(a - b) > 1e-3 + 1e-3 * abs(b)
                                 for a, b in zip(y, ref, strict=True)):
        raise ServerFailed(f"{srv.name} {sc.name}: wrong output {y[:4]}… expected {ref[:4]}…")


def run_wrk(url: str, sc: Scenario, req: Request, seconds: float, cpus: str | None) -> dict:
    script = BENCH / "wrk" / ("binary.lua" if sc.binary else "json.lua")
    env = {**os.environ, "BENCH_BODY": str(req.body_file)}
    if sc.binary:
        env["BENCH_HEADER_LEN"] = str(req.header_len)
    cmd = (["taskset", "-c", cpus] if cpus else []) + [
        "wrk", "-t1", f"-c{sc.conc}", f"-d{max(1, round(seconds))}s", "--timeout", "10s",
        "-s", str(script), url]
    before = children_cpu_seconds()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=seconds + 60)
    used = children_cpu_seconds() - before
    m = re.search(r"^BENCH_RESULT (\{.*\})$", p.stdout, re.M)
    if p.returncode != 0 or not m:
        raise ServerFailed(f"wrk failed ({p.returncode}): {p.stdout[-800:]} {p.stderr[-800:]}")
    res = json.loads(m.group(1))
    # cores wrk itself used: near 1.0, the load generator (one thread) is the limit, not the server
    res["wrk_cores"] = used / max(1, round(seconds))
    return res


def children_cpu_seconds() -> float:
    """User + system CPU of this process's ended children so far (the load generators)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# --------------------------------------------------------------------------------------------
# Pinning modes and the CPU-burning neighbour (--modes, --neighbours)
# --------------------------------------------------------------------------------------------

MODES = ("pinned", "unpinned", "busy")
MODE_TITLES = {"pinned": "server on --server-cpus, wrk on --wrk-cpus",
               "unpinned": "no pinning, as users run it",
               "busy": "no pinning, CPU-burning neighbour process(es) running"}


def mode_scenarios(args) -> list[tuple[str, Scenario]]:
    """Every (mode, scenario) the table has a row group for, mode by mode."""
    return [(mode, replace(sc, name=f"{sc.name} {mode}")) for mode in args.modes
            for sc in args.scenarios]


def sized_by_cpus(name: str, args) -> bool:
    """Whether a server decides its process count from the CPUs it starts on (mmc-serve's
    default --workers auto): started again under each mode's pinning, as a user would start
    it on one core (one worker) or on the whole machine (one per CPU), rather than pinning
    workers started for two cores onto one."""
    return (name == "ours" and not args.ours_workers) or name == "before"


def mode_cpus(args, mode: str) -> tuple[str | None, str | None]:
    """(server CPUs, wrk CPUs) for a mode; None = every CPU."""
    return (args.server_cpus or None, args.wrk_cpus or None) if mode == "pinned" else (None, None)


def pin_group(pgid: int, cpus: str | None) -> None:
    """Move every thread of a running server's process group onto `cpus` (None: all)."""
    spec = cpus or f"0-{os.cpu_count() - 1}"
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rpartition(")")[2].split()[2]) != pgid:
                continue
        except (OSError, ValueError):
            continue
        subprocess.run(["taskset", "-a", "-p", "-c", spec, stat.parent.name],
                       capture_output=True)


class Neighbours:
    """`count` processes that burn CPU (a Python busy loop, unpinned) while they live: the
    other tenant of a busy host, the same one for every server's loads in the mode."""

    def __init__(self, count: int) -> None:
        # Each in a session of its own, as another service on the host would be: with the
        # kernel's autogroup scheduling (sched_autogroup_enabled) a neighbour left in the
        # bench's session would share wrk's group and slow the load generator, not the servers.
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                       stdin=subprocess.DEVNULL, start_new_session=True)
                      for _ in range(count)]

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait(5)
        self.procs = []


def group_cpu_seconds(pgid: int) -> float:
    """CPU (user + system) used so far by the live processes of a server's process group
    (Triton's python-backend stubs included): what the server cost, whatever the neighbours."""
    hz = os.sysconf("SC_CLK_TCK")
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after the name: state ppid pgrp ...
            total += int(fields[11]) + int(fields[12])
    return total / hz


def group_memory(pgid: int) -> str:
    """How many processes a server runs and the resident memory of each (VmRSS, MB)."""
    sizes = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            if int((status.parent / "stat").read_text().rpartition(")")[2].split()[2]) != pgid:
                continue
            rss = next(int(line.split()[1]) for line in status.read_text().splitlines()
                       if line.startswith("VmRSS:"))
        except (OSError, ValueError, StopIteration):
            continue
        sizes.append(rss / 1024)
    sizes.sort(reverse=True)
    return (f"{len(sizes)} process(es), RSS {' + '.join(f'{s:.0f}' for s in sizes)} MB "
            f"= {sum(sizes):.0f} MB")


def cpu_per_request(cpu0: float, pgid: int, res: dict) -> float:
    """Server CPU µs per answered request during one wrk run."""
    return (group_cpu_seconds(pgid) - cpu0) * 1e6 / max(1, res["requests"])


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------

def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), {cpu}, " \
           f"Linux {platform.release()}"


class CpuWatch:
    """CPU used by other tenants while we run (shared machines make figures noisy): all busy
    ticks in /proc/stat minus this process's and its reaped children's CPU time."""

    def __init__(self) -> None:
        self.t0, self.b0, self.own0 = *self._stat(), self._own()

    @staticmethod
    def _stat() -> tuple[float, float]:
        f = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:8]]
        hz = os.sysconf("SC_CLK_TCK")
        return sum(f) / hz, (sum(f) - f[3] - f[4]) / hz

    @staticmethod
    def _own() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def report(self) -> str:
        t1, b1 = self._stat()
        total, busy = t1 - self.t0, b1 - self.b0
        foreign = max(0.0, busy - (self._own() - self.own0))
        return (f"other processes used {foreign / max(total, 1e-9):.0%} of the machine's CPU "
                f"during the run (all busy {busy / max(total, 1e-9):.0%}); load average at end "
                + " ".join(Path("/proc/loadavg").read_text().split()[:3]))


def pkg_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(name)
    except PackageNotFoundError:
        return "?"


def ours_ort_version() -> str:
    p = subprocess.run([OUR_PY, "-c", "import onnxruntime; print(onnxruntime.__version__)"],
                       capture_output=True, text=True)
    return p.stdout.strip() or "?"


def fmt_ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}×" if a and b else "–"


def fmt_cpu(v: dict, row: dict) -> str:
    """Median server CPU per request over the rounds, and Triton's over ours (>1: we use less)."""
    def median_cpu(cell) -> float | None:
        cpus = sorted(cell.get("cpu_rounds") or []) if isinstance(cell, dict) else []
        return cpus[len(cpus) // 2] if cpus else None
    ours, triton = median_cpu(v), median_cpu(row.get("triton"))
    if ours is None:
        return "–"
    return f"{ours:,.0f}" + (f" ({triton / ours:.2f}×)" if triton else "")


def render(args, results: dict, raw: dict, notes: list[str], versions: dict[str, str],
           pinning: str) -> str:
    lines = [
        "# Serving benchmark (bench/serving.py)", "",
        f"- date: {dt.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
        f"- machine: {machine()}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        f"- pinning: {pinning}",
        "- modes (the word after each scenario): " + "; ".join(
            f"{m}: {MODE_TITLES[m]}" + (f" ({args.neighbours})" if m == "busy" else "")
            for m in args.modes) + "; ours with " + (
            f"--workers {args.ours_workers}" if args.ours_workers else "its default --workers")
        + "; every server started unpinned (then pinned per mode)",
        f"- background: {args.background}",
        f"- load: wrk -t1 (HTTP) or h2load -t1 on one HTTP/2 connection carrying c concurrent "
        f"calls (gRPC), {args.duration:g} s per run after a {args.warmup:g} s warm-up, "
        f"loopback, one row per request; {args.rounds} round(s) per server and scenario, "
        + ("one server up at a time" if args.sequential else
           "all servers up, interleaved scenario by scenario")
        + "; the table keeps each cell's best round (all rounds in the last column)",
        "",
    ]
    if raw:
        lines += ["## Raw onnxruntime in-process (tight loop, same threads and pinning)", "",
                  "| model | batch | rows/s |", "|---|---:|---:|"]
        lines += [f"| {m} | {b} | {v:,.0f} |" for (m, b), v in raw.items()]
        lines.append("")
    lines += [
        "## Servers", "",
        "| scenario | server | req/s | p50 ms | p99 ms | failed | vs Triton | vs MLServer "
        "| vs bare | vs raw ORT b1 / b8 | server CPU µs/req (vs Triton) | load-gen cores "
        "| rounds req/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for _, sc in mode_scenarios(args):
        row = results.get(sc.name, {})
        rps = {k: v["rps"] for k, v in row.items() if isinstance(v, dict)}
        for srv in args.servers:
            if srv == "raw" or srv not in row:
                continue
            v = row[srv]
            if isinstance(v, str):
                lines.append(f"| {sc.name} | {srv} | {v} | | | | | | | | | | |")
                continue
            bad = v["non2xx"] + v["connect_err"] + v["read_err"] + v["write_err"] \
                + v["timeout_err"]
            err = f"{v['non2xx']}" + (f" (+{bad - v['non2xx']} socket)" if bad > v["non2xx"]
                                      else "")
            vs_raw = "–"
            if sc.model == "conv" and raw:
                r1, r8 = raw.get(("conv", 1)), raw.get(("conv", 8))
                vs_raw = f"{v['rps'] / r1:.0%} / {v['rps'] / r8:.0%}" if r1 and r8 else "–"
            lines.append(
                f"| {sc.name} | {srv} | {v['rps']:,.0f} | {v['p50_us'] / 1e3:.2f} | "
                f"{v['p99_us'] / 1e3:.2f} | {err} | {fmt_ratio(v['rps'], rps.get('triton'))} | "
                f"{fmt_ratio(v['rps'], rps.get('mlserver'))} | "
                f"{fmt_ratio(v['rps'], rps.get('bare'))} | {vs_raw} | {fmt_cpu(v, row)} | "
                f"{v.get('wrk_cores', float('nan')):.2f} | "
                + ", ".join(f"{r:,.0f}" for r in v.get("rounds", [])) + " |")
    lines += ["", "Scenarios: " + "; ".join(f"`{s.name}` {s.title}" for s in args.scenarios),
              "Ratios are req/s of the row's server over the named peer's, same scenario, same "
              "run. Server CPU µs/req: user + system CPU of the server's processes per answered "
              "request (median of the rounds), which other tenants of a shared machine do not "
              "inflate the way they do req/s; in brackets Triton's over the row's (>1: less CPU "
              "per request than Triton). \"vs raw ORT\" = conv rows/s through the server over "
              "raw onnxruntime rows/s at batch 1 and at batch 8 (the servers' max batch). "
              "Failed: non-2xx answers (HTTP), or failed calls (gRPC: h2load's, plus the growth "
              "of the server's own nv_inference_request_failure where it keeps Triton's "
              "counters: ours and Triton; MLServer's gRPC errors, carried in trailers, only "
              "show as missing answers). Load-gen cores: CPU wrk or h2load itself used in the "
              "kept round; near 1.00 its one thread was the limit, whatever the server could "
              "do.", ""]
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# gRPC scenarios: KServe v2 ModelInfer with raw contents, against each server's own gRPC front
# --------------------------------------------------------------------------------------------
# Load: h2load (Debian nghttp2-client, C) on one HTTP/2 connection carrying `conc` concurrent
# ModelInfer calls, as one tritonclient.grpc channel does; the body is the gRPC-framed request
# (raw_input_contents). PyPI's perf-analyzer here is a 0.1.0 placeholder, and a Python load loop
# would be the bottleneck on two cores. h2load sees HTTP statuses only (a gRPC error is HTTP 200
# with grpc-status in the trailers), so every run is also checked on the server: its Prometheus
# nv_inference_request_failure must not grow (a note says so when nv_inference_request_success
# grew by less than the calls h2load counted).

GRPC_RESULTS = BENCH / "results" / "serving-grpc-latest.md"
GRPC_METHOD = "/inference.GRPCInferenceService/ModelInfer"

#: Run with .venv's Python (tritonclient ships the messages): writes one gRPC-framed
#: ModelInferRequest per model, same inputs as the HTTP scenarios' binary bodies.
GRPC_BODIES_PY = """
import json, struct, sys
import numpy as np
from tritonclient.grpc import service_pb2 as pb
rng = np.random.default_rng(0)  # the inputs make_requests draws, in the same order
for model, shape, path in json.loads(sys.argv[1]):
    x = np.round(rng.uniform(-1, 1, size=shape), 3).astype(np.float32)
    np.save(path + ".x.npy", x)
    request = pb.ModelInferRequest(model_name=model, inputs=[
        pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=shape)],
        raw_input_contents=[x.astype("<f4").tobytes()])
    message = request.SerializeToString()
    open(path, "wb").write(b"\\0" + struct.pack(">I", len(message)) + message)
"""

#: Run with .venv's Python: one call through tritonclient.grpc, unchanged; prints output y.
GRPC_CHECK_PY = """
import json, sys
import numpy as np
import tritonclient.grpc as g
address, model, x = sys.argv[1], sys.argv[2], np.load(sys.argv[3])
tensor = g.InferInput("x", list(x.shape), "FP32")
tensor.set_data_from_numpy(x)
client = g.InferenceServerClient(address)
print(json.dumps(client.infer(model, [tensor]).as_numpy("y").ravel().tolist()))
"""


def grpc_bodies(work: Path) -> dict[str, Path]:
    bodies = {m: work / f"{m}.grpc.body" for m in SHAPES}
    spec = json.dumps([[m, list(SHAPES[m]), str(bodies[m])] for m in SHAPES])
    subprocess.run([OUR_PY, "-c", GRPC_BODIES_PY, spec], check=True)
    return bodies


def grpc_check_by_hand(address: str, sc: Scenario, body: Path, reference: list[float]) -> None:
    p = subprocess.run([OUR_PY, "-c", GRPC_CHECK_PY, address, sc.model, f"{body}.x.npy"],
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise ServerFailed(f"{address} {sc.name}: tritonclient.grpc failed: {p.stderr[-500:]}")
    y = json.loads(p.stdout)
    if len(y) != len(reference) or any(abs(a - b) > 1e-3 + 1e-3 * abs(b)
                                       for a, b in zip(y, reference, strict=True)):
        raise ServerFailed(f"{address} {sc.name}: wrong output {y[:4]}… expected "
                           f"{reference[:4]}…")


def grpc_counters(metrics_port: int, model: str) -> tuple[float, float]:
    """(successes, failures) the server counted for `model` (Triton's metric names)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = {"nv_inference_request_success": 0.0, "nv_inference_request_failure": 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in found and f'model="{model}"' in line:
            found[name] += float(line.rsplit(" ", 1)[1])
    return found["nv_inference_request_success"], found["nv_inference_request_failure"]


def run_h2load(address: str, sc: Scenario, body: Path, seconds: float, cpus: str | None,
               work: Path, calls: int | None = None) -> dict:
    """req/s and latency percentiles of one h2load run (its per-request log): for `seconds`
    (-D), or, given `calls`, exactly that many calls (-n). A timed run stops with up to c calls
    in flight, which Triton counts as failures once h2load closes the connection; a counted
    run ends with every call answered."""
    log_file = work / "h2load-requests.log"
    log_file.unlink(missing_ok=True)
    limit = ["-n", str(calls)] if calls else ["-D", str(max(1, round(seconds)))]
    cmd = (["taskset", "-c", cpus] if cpus else []) + [
        "h2load", *limit, "-c", "1", "-m", str(sc.conc), "-t", "1",
        "-H", "content-type: application/grpc", "-H", "te: trailers", "-d", str(body),
        "--log-file", str(log_file), f"http://{address}{GRPC_METHOD}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3 * seconds + 60)
    done = re.search(r"requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded, "
                     r"(\d+) failed, (\d+) errored, (\d+) timeout", p.stdout)
    finished = re.search(r"finished in ([\d.]+)(ms|s),", p.stdout)
    if p.returncode != 0 or not done or not finished:
        raise ServerFailed(f"h2load failed ({p.returncode}): {p.stdout[-800:]} {p.stderr[-800:]}")
    elapsed = float(finished.group(1)) / (1000 if finished.group(2) == "ms" else 1)
    times = sorted(int(line.split("\t")[2]) for line in log_file.read_text().splitlines()
                   if line.count("\t") >= 2)
    succeeded = int(done.group(3))

    def pct(q: float) -> float:
        return times[min(len(times) - 1, int(q * len(times)))] if times else 0.0

    took = elapsed if calls else max(1, round(seconds))
    return {"rps": succeeded / took, "seconds": took, "p50_us": pct(0.5), "p99_us": pct(0.99),
            "calls": succeeded, "failed": sum(int(done.group(i)) for i in (4, 5, 6))}


def run_grpc(srv: Running, sc: Scenario, body: Path, seconds: float, cpus: str | None,
             work: Path, notes: list[str] | None = None, rate: float | None = None) -> dict:
    """One h2load run against srv's gRPC front, in run_wrk's shape (failed calls as non2xx);
    given the server's `rate` (req/s) in an earlier run, as many calls as take about `seconds`
    at that rate. With `notes`, the server's own counters are read around the run where it
    keeps Triton's (ours, Triton): h2load sees only HTTP statuses, and a gRPC error is HTTP
    200 with grpc-status in the trailers."""
    address = f"127.0.0.1:{srv.grpc_port}"
    counted = notes is not None and srv.metrics_port is not None
    if counted:
        time.sleep(1.0)  # what an earlier timed run left in flight is counted by now
        ok0, bad0 = grpc_counters(srv.metrics_port, sc.model)
    calls = max(20 * sc.conc, round(rate * seconds)) if rate else None
    before = children_cpu_seconds()
    res = run_h2load(address, sc, body, seconds, cpus, work, calls)
    used = children_cpu_seconds() - before
    failed = res["failed"]
    if counted:
        time.sleep(1.0)  # the last answers' counts land (Triton counts them asynchronously)
        ok1, bad1 = grpc_counters(srv.metrics_port, sc.model)
        failed += int(bad1 - bad0)
        if ok1 - ok0 < res["calls"]:  # a lagging counter, or errors it missed
            notes.append(f"{srv.name} {sc.name}: h2load counted {res['calls']} answers, the "
                         f"server's success counter {int(ok1 - ok0)}")
    return {"rps": res["rps"], "p50_us": res["p50_us"], "p99_us": res["p99_us"],
            "requests": res["calls"], "non2xx": failed, "connect_err": 0, "read_err": 0,
            "write_err": 0, "timeout_err": 0,
            "wrk_cores": used / res["seconds"]}


# --------------------------------------------------------------------------------------------

def run_load(srv: Running, sc: Scenario, req: Request, grpc_body: Path | None, seconds: float,
             cpus: str | None, work: Path, notes: list[str] | None = None,
             rate: float | None = None) -> dict:
    """One load run of a scenario: h2load on the gRPC front (`notes`: check the server's own
    counters; `rate`: see run_grpc) or wrk on /v2/models/<model>/infer."""
    if sc.grpc:
        return run_grpc(srv, sc, grpc_body, seconds, cpus, work, notes, rate)
    return run_wrk(srv.url(f"/v2/models/{sc.model}/infer"), sc, req, seconds, cpus)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(s for s in SERVERS if s != "before"),
                   help=f"comma list of {','.join(SERVERS)} (default: all but before)")
    p.add_argument("--before", default="",
                   help="another checkout of this repo to run as server 'before'")
    p.add_argument("--scenarios", default=",".join(SCENARIOS),
                   help=f"comma list of {','.join(SCENARIOS)} (default: all)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per wrk run")
    p.add_argument("--rounds", type=int, default=2,
                   help="wrk runs per server and scenario, interleaved across servers; the "
                        "table keeps the best round (noise on a shared machine only slows)")
    p.add_argument("--sequential", action="store_true",
                   help="start, load and stop one server at a time instead of keeping all up "
                        "and interleaving them scenario by scenario")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of wrk before each run")
    p.add_argument("--server-cpus", default="0",
                   help="taskset CPU list for every server and raw onnxruntime ('' = no pin)")
    p.add_argument("--wrk-cpus", default="1", help="taskset CPU list for wrk ('' = no pin)")
    p.add_argument("--ort-threads", type=int, default=1,
                   help="onnxruntime intra_op threads in every server and the raw loop")
    p.add_argument("--modes", default=",".join(MODES),
                   help="comma list of pinned (server on --server-cpus, wrk on --wrk-cpus), "
                        "unpinned (as users run it), busy (unpinned with --neighbours "
                        "CPU-burning processes); every mode loads every server (default: all)")
    p.add_argument("--neighbours", type=int, default=1,
                   help="CPU-burning processes running through the busy mode's loads")
    p.add_argument("--ours-workers", default=None,
                   help="mmc-serve --workers for ours (default: none given, mmc-serve's own "
                        "default, as users run it); before keeps its own default")
    p.add_argument("--triton-delay-us", type=int, default=500,
                   help="Triton dynamic_batching max_queue_delay_microseconds")
    p.add_argument("--ours-env", action="append", default=[], metavar="NAME=VALUE",
                   help="an environment setting for 'ours' only (repeatable), e.g. "
                        "MMC_GRPC_TRANSPORT=fast")
    p.add_argument("--output", default=str(RESULTS), help="markdown file to write")
    p.add_argument("--grpc", action="store_true",
                   help="only the gRPC scenarios (written to "
                        f"{GRPC_RESULTS.relative_to(REPO)} unless --output says otherwise)")
    a = p.parse_args(argv)
    a.servers = [s.strip() for s in a.only.split(",") if s.strip()]
    bad_env = [kv for kv in a.ours_env if "=" not in kv]
    if bad_env:
        p.error(f"--ours-env wants NAME=VALUE, not {bad_env[0]!r}")
    a.ours_env = dict(kv.split("=", 1) for kv in a.ours_env)
    if a.before and "before" not in a.servers:
        a.servers.append("before")
    if "before" in a.servers and not a.before:
        p.error("server 'before' needs --before DIR")
    bad = [s for s in a.servers if s not in SERVERS]
    names = [s.strip() for s in a.scenarios.split(",") if s.strip()]
    if a.grpc:
        names = [s for s in names if s not in SCENARIOS or SCENARIOS[s].grpc]
        if a.output == str(RESULTS):
            a.output = str(GRPC_RESULTS)
    bad += [s for s in names if s not in SCENARIOS]
    if bad:
        p.error(f"unknown: {', '.join(bad)}")
    a.scenarios = [SCENARIOS[s] for s in names]
    a.modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if not a.modes or any(m not in MODES for m in a.modes):
        p.error(f"--modes takes a comma list of {', '.join(MODES)}")
    ncpu = len(os.sched_getaffinity(0))
    for cpus in (a.server_cpus, a.wrk_cpus):
        if cpus and max(parse_cpus(cpus)) >= os.cpu_count():
            p.error(f"CPU list {cpus} is beyond this machine's {ncpu} CPUs")
    return a


def start_server(name: str, setup, work: Path, args, notes: list[str],
                 versions: dict[str, str], cpus: str | None = None) -> Running | None:
    log(f"[{name}] starting")
    if name == "ours" and not OUR_SERVE.exists():
        msg = f"ours skipped: {OUR_SERVE} does not exist (not built yet)"
        log("  " + msg)
        notes.append(msg)
        return None
    port = free_port()
    try:
        # Unpinned, as users start it (a server sizes its pools from the CPUs it sees); the mode
        # loop pins it where a mode says (and starts ours again there: see sized_by_cpus).
        srv = Running(name, setup(port), port, work, cpus)
    except ServerFailed as e:
        if name == "ours":
            msg = f"ours skipped: mmc-serve did not become ready: {e}"
            log("  " + msg)
            lines = [ln.strip(" |") for ln in msg.splitlines() if ln.strip(" |")]
            notes.append(lines[0] + (" … " + lines[-1] if len(lines) > 1 else ""))
        else:
            log(f"  ERROR: {e}")
            notes.append(f"{name} FAILED to start: {str(e).splitlines()[0]}")
        return None
    if name != "bare":
        versions[f"{name} /v2"] = srv.server_version()
    return srv


def main() -> int:
    args = parse_args(sys.argv[1:])
    ensure_environment()
    pinning = (f"servers and raw onnxruntime: taskset -c {args.server_cpus or '(none)'}; "
               f"wrk: taskset -c {args.wrk_cpus or '(none)'}; onnxruntime intra_op_num_threads="
               f"{args.ort_threads}, inter_op_num_threads=1; OMP_NUM_THREADS=1; Triton dynamic "
               f"batching {args.triton_delay_us} µs, max batch mlp 32 / conv 8; ours: "
               f"config.json max_batch_size 32 / 8, max_queue_delay_us 0, "
               f"env MMC_ORT_INTRA_OP_THREADS={args.ort_threads}")
    log(f"[bench] {machine()}")
    log(f"[bench] pinning: {pinning}")
    watch = CpuWatch()
    failed = False
    notes: list[str] = []
    versions = {"python": platform.python_version(), "wrk": subprocess.run(
        ["wrk", "-v"], capture_output=True, text=True).stdout.split(" [")[0].split()[-1],
        "onnxruntime (peers)": pkg_version("onnxruntime"), "mlserver": pkg_version("mlserver"),
        "nvidia-pytriton": pkg_version("nvidia-pytriton"), "uvicorn": pkg_version("uvicorn"),
        "uvloop": pkg_version("uvloop"), "httptools": pkg_version("httptools"),
        "orjson": pkg_version("orjson")}
    if any(sc.grpc for sc in args.scenarios):
        versions["h2load"] = subprocess.run(["h2load", "--version"], capture_output=True,
                                            text=True).stdout.strip().split()[-1]
    with tempfile.TemporaryDirectory(prefix="mmc-bench-") as tmp:
        work = Path(tmp)
        models = build_models(work)
        reqs = make_requests(work, models)
        bodies = grpc_bodies(work) if any(sc.grpc for sc in args.scenarios) else {}
        raw = {}
        if "raw" in args.servers:
            log("[raw] onnxruntime in-process")
            raw = raw_onnxruntime(models, args.ort_threads, args.server_cpus or None)
        results: dict[str, dict[str, dict | str]] = {}
        setups = {
            "bare": lambda p: setup_bare(work, models, p, args.ort_threads),
            "mlserver": lambda p: setup_mlserver(work, models, p, args.ort_threads),
            "triton": lambda p: setup_triton(work, models, p, args.ort_threads,
                                             args.triton_delay_us),
            "ours": lambda p: setup_ours(work, models, p, args.ort_threads,
                                         workers=args.ours_workers, extra_env=args.ours_env),
            "before": lambda p: setup_ours(work, models, p, args.ort_threads,
                                           Path(args.before)),
        }
        names = [s for s in SERVERS if s in args.servers and s != "raw"]
        groups = [[n] for n in names] if args.sequential else [names]
        for group in groups:
            running: dict[str, Running] = {}
            neighbours: Neighbours | None = None
            try:
                for name in group:
                    srv = start_server(name, setups[name], work, args, notes, versions)
                    if srv is None:
                        failed |= name != "ours"
                        continue
                    running[name] = srv
                    for sc in args.scenarios:
                        cells = [results.setdefault(f"{sc.name} {m}", {}) for m in args.modes]
                        missing = ("n/a (no gRPC front)" if sc.grpc and srv.grpc_port is None
                                   else "n/a (no binary tensor extension)"
                                   if name == "mlserver" and sc.binary and not sc.grpc else None)
                        if missing:
                            for cell in cells:
                                cell[name] = missing
                            continue
                        try:
                            if sc.grpc:
                                grpc_check_by_hand(f"127.0.0.1:{srv.grpc_port}", sc,
                                                   bodies[sc.model],
                                                   reqs[(sc.model, True)].reference)
                            else:
                                check_by_hand(srv, sc, reqs[(sc.model, sc.binary)])
                            for cell in cells:
                                cell[name] = []
                        except ServerFailed as e:
                            log(f"  ERROR {sc.name}: {e}")
                            for cell in cells:
                                cell[name] = "FAILED (see notes)"
                            notes.append(f"{name} {sc.name} FAILED: {str(e).splitlines()[0]}")
                            failed = True
                    log(f"  {name}: one response per scenario checked against onnxruntime")
                mode = None
                for sc_mode, sc in mode_scenarios(args):
                    if sc_mode != mode:  # re-pin the running servers, start/stop the neighbour
                        mode = sc_mode
                        server_cpus, wrk_cpus = mode_cpus(args, mode)
                        for name in list(running):
                            if sized_by_cpus(name, args):  # as a user starts it on these CPUs
                                running[name].stop()
                                srv = start_server(name, setups[name], work, args, notes,
                                                   versions, server_cpus)
                                if srv is None:
                                    del running[name]
                                    continue
                                running[name] = srv
                            pin_group(running[name].proc.pid, server_cpus)
                        if neighbours:
                            neighbours.stop()
                        neighbours = Neighbours(args.neighbours) if mode == "busy" else None
                        log(f"[mode] {mode}: {MODE_TITLES[mode]}")
                    log(f"[load] {sc.name}: {sc.title}")
                    req = reqs[(sc.model, sc.binary)]
                    rates: dict[str, float] = {}  # each server's req/s in its last run
                    for rnd in range(args.rounds):
                        for name, srv in running.items():
                            runs = results[sc.name][name]
                            if not isinstance(runs, list):
                                continue
                            body = bodies.get(sc.model) if sc.grpc else None
                            try:
                                if args.warmup > 0 and rnd == 0:
                                    rates[name] = run_load(srv, sc, req, body, args.warmup,
                                                           wrk_cpus, work)["rps"]
                                cpu0 = group_cpu_seconds(srv.proc.pid)
                                res = run_load(srv, sc, req, body, args.duration, wrk_cpus, work,
                                               notes, rates.get(name))
                                rates[name] = res["rps"]
                                res["cpu_us"] = cpu_per_request(cpu0, srv.proc.pid, res)
                            except (ServerFailed, OSError) as e:
                                log(f"  ERROR {name} {sc.name}: {e}")
                                results[sc.name][name] = "FAILED (see notes)"
                                notes.append(f"{name} {sc.name} FAILED: {str(e).splitlines()[0]}")
                                failed = True
                                continue
                            runs.append(res)
                            bad = res["non2xx"] + res["connect_err"] + res["read_err"] + \
                                res["write_err"] + res["timeout_err"]
                            if bad:
                                failed = True
                                notes.append(f"{name} {sc.name}: {res['non2xx']} failed answers,"
                                             f" {bad - res['non2xx']} socket errors: a failed run")
                            log(f"  round {rnd + 1} {name:9s} {res['rps']:10,.0f} req/s  p50 "
                                f"{res['p50_us'] / 1e3:7.2f} ms  p99 {res['p99_us'] / 1e3:7.2f} "
                                f"ms  failed {res['non2xx']}  CPU {res['cpu_us']:,.0f} µs/req"
                                f"  load generator {res['wrk_cores']:.2f} cores"
                                + (f"  socket errors {bad - res['non2xx']}"
                                   if bad > res["non2xx"] else ""))
            finally:
                if neighbours:
                    neighbours.stop()
                for name, srv in running.items():
                    notes.append(f"{name} after its loads: {group_memory(srv.proc.pid)}")
                    srv.stop()
        for row in results.values():  # keep the best round; count failures over all rounds
            for name, runs in list(row.items()):
                if isinstance(runs, list):
                    if not runs:
                        row[name] = "no run"
                        continue
                    best = dict(max(runs, key=lambda r: r["rps"]))
                    for k in ("non2xx", "connect_err", "read_err", "write_err", "timeout_err"):
                        best[k] = sum(r[k] for r in runs)
                    best["rounds"] = [r["rps"] for r in runs]
                    best["cpu_rounds"] = [r["cpu_us"] for r in runs if "cpu_us" in r]
                    row[name] = best
    if "ours" in args.servers:
        versions["onnxruntime (ours, .venv)"] = ours_ort_version()
    args.background = watch.report()
    log(f"[bench] background: {args.background}")
    report = render(args, results, raw, notes, versions, pinning)
    print()
    print(report)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    log(f"[bench] written to {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
