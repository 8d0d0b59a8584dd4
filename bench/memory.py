"""Memory of each server's whole process tree after it served the bench's two models.

    .venv/bin/python bench/memory.py [--only ours-1,ours-auto,ours-1-grpc,triton]
                                     [--requests 200] [--settle 3] [--before DIR]
                                     [--ours-env NAME=VALUE ...] [--trim] [--no-probe]

Servers (`--only`): `ours-1` (`mmc-serve --workers 1`, gRPC off), `ours-auto` (`mmc-serve` with
its default `--workers auto`: the supervisor and one worker per CPU), `ours-1-grpc` (`--workers 1
--grpc-port P`), `triton` (tritonserver 2.51 with the python backend, as bench/serving.py runs it:
the server and one python-backend stub per model); `--before DIR` adds `before-1`: `--workers 1`
from another checkout (bench/serving.py's "before"). Everything is bench/serving.py's: the models
(registry.samples), the request bodies and their onnxruntime references (made in a child process,
so that this one never maps .venv's onnxruntime and takes part of ours' PSS), the launches
(setup_ours, setup_triton under the peer venv), Running, check_by_hand, the gRPC bodies, checks
and h2load.

One server at a time (PSS divides a page among every process that maps it: two servers up
together would share their libraries and each look smaller), each:
- started with both models; every HTTP scenario's answer checked by hand against onnxruntime
  (check_by_hand) `--warmup` times;
- `--requests` requests per HTTP scenario (MLP v2 JSON from 32 threads, conv binary and conv v2
  JSON from 8: the concurrency of bench/serving.py's scenarios, so batches form and the buffers
  they need are allocated), httpx keep-alive clients; where the server listens for gRPC,
  `--requests` ModelInfer calls per model (h2load, after one checked call through tritonclient);
- after `--settle` seconds (past ours' own heap trim, a second after bodies that held 32 MiB
  at once: none here), every process of
  its tree (the server and all its descendants): Rss, Pss, Pss_Anon, Pss_File of
  /proc/<pid>/smaps_rollup, VmHWM (peak RSS) and threads of /proc/<pid>/status; the largest
  process's mappings grouped by what they are (libraries by package, malloc's main heap, thread
  arenas, 1 MiB Python object arenas, other anonymous memory);
- with `--trim`, glibc's malloc_trim(0) called in each of its processes (gdb) and RSS read
  again: how much of it was freed memory malloc kept for reuse;
- stopped.
`--requests 0 --warmup 0` reads servers that loaded their models and answered nothing.

Then (unless `--no-probe`) a probe: `mmc-serve --workers 1` (gRPC off) started in a Python
process of its own under `-X importtime`, one request per model, then its `sys.modules`: the
top-level packages it loaded (and the ones a feature that is off should not need), and the RSS
each adds when imported alone, one after the other in the order the worker imported them.

Writes bench/results/memory-latest.md (and stdout). Needs .venv (mmc-serve, httpx,
tritonclient) and, for triton, bench/.peers/venv (made by `python3 bench/serving.py`).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime as dt
import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_serving", REPO / "bench" / "serving.py")
bs = sys.modules["bench_serving"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bs)

RESULTS = REPO / "bench" / "results" / "memory-latest.md"
SERVERS = ["ours-1", "ours-auto", "ours-1-grpc", "triton", "before-1"]
HTTP_SCENARIOS = ["mlp-json-c32", "conv-bin-c8", "conv-json-c8"]
GRPC_SCENARIOS = ["grpc-mlp-c32", "grpc-conv-c8"]
MB = 1024.0  # smaps figures are kB

#: Run with the peer venv's Python: bench/serving.py's setup_triton (it finds tritonserver and
#: the python-backend stub in the interpreter's own site-packages); prints the Launch as JSON.
TRITON_LAUNCH_PY = """
import dataclasses, importlib.util, json, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("bench_serving", sys.argv[1])
bs = sys.modules["bench_serving"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bs)
models = {k: Path(v) for k, v in json.loads(sys.argv[3]).items()}
launch = bs.setup_triton(Path(sys.argv[2]), models, int(sys.argv[4]), int(sys.argv[5]),
                         int(sys.argv[6]))
print(json.dumps(dataclasses.asdict(launch)))
"""

#: Run with .venv's Python, the repository first on sys.path: mmc-serve's main() in this
#: process, while a thread waits for readiness, sends one request per model over a bare socket
#: (urllib or httpx would add their own imports) and writes sys.modules in import order.
PROBE_PY = r"""
import json, os, signal, socket, sys, threading, time
out, port, argv, bodies = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), \
    json.loads(sys.argv[4])
before = list(sys.modules)

def call(path, body=b"", headers=()):
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        head = [f"{'POST' if body else 'GET'} {path} HTTP/1.1", "Host: x",
                "Connection: close", f"Content-Length: {len(body)}", *headers, "", ""]
        s.sendall("\r\n".join(head).encode() + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data.split(b" ", 2)[1]

def watch():
    while True:
        try:
            if call("/v2/health/ready") == b"200":
                break
        except OSError:
            pass
        time.sleep(0.2)
    statuses = []
    for model, path, header_len in bodies:
        headers = [f"Inference-Header-Content-Length: {header_len}"] if header_len else []
        statuses.append(call(f"/v2/models/{model}/infer", open(path, "rb").read(),
                             headers).decode())
    with open(out, "w") as f:
        mods = list(sys.modules)
        files = {m: getattr(sys.modules[m], "__file__", None) for m in mods if "." not in m}
        json.dump({"before": before, "modules": mods, "files": files, "statuses": statuses}, f)
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=watch, daemon=True).start()
from serving.cli import main
main(argv)
"""

#: Run with .venv's Python: import each named module in turn, printing the RSS it added (kB).
IMPORT_COST_PY = r"""
import importlib, json, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
rows = [["(interpreter)", rss()]]
for name in json.loads(sys.argv[1]):
    r0 = rss()
    try:
        importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - a module that only imports inside the server
        rows.append([name + f" (failed: {type(e).__name__})", rss() - r0])
        continue
    rows.append([name, rss() - r0])
print(json.dumps(rows))
"""

#: Packages a worker should not need while the feature that uses them is off (gRPC, S3, the
#: registry's database, the HTTP control plane, TensorRT), and the fast JSON paths.
WATCHED = {
    "grpc": "gRPC front (grpcio)", "google.protobuf": "protobuf (gRPC codec; onnx)",
    "serving.grpc": "our gRPC front", "h2": "h2 (HTTP/2)", "boto3": "S3", "botocore": "S3",
    "django": "registry database", "redis": "clustered rate limits", "httpx": "HTTP control plane",
    "tensorrt": "TensorRT", "onnx": "signature reading (registry.signatures)",
    "simdjson": "fast JSON numbers", "orjson": "JSON", "uvloop": "event loop",
    "ml_dtypes": "bfloat16", "prometheus_client": "metrics", "watchfiles": "uvicorn --reload",
    "ssl": "TLS", "multiprocessing": "uvicorn's supervisors", "click": "uvicorn's CLI",
    "tritonclient": "(bench/tests only)", "pandas": "-", "scipy": "-", "torch": "-",
}


#: Modules imported after their package, measured on their own after the packages.
LATER_MODULES = ["uvicorn.protocols.websockets.websockets_impl",
                 "uvicorn.protocols.websockets.websockets_sansio_impl",
                 "uvicorn.protocols.websockets.wsproto_impl", "serving.http.app"]


def log(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------------------------
# Reading a process tree's memory
# --------------------------------------------------------------------------------------------

def tree_pids(root: int) -> list[int]:
    """`root` and all its live descendants (parent links of /proc/<pid>/stat), root first."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children[ppid].append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        if Path(f"/proc/{pid}").exists():
            out.append(pid)
            todo += sorted(children.get(pid, []))
    return out


def proc_memory(pid: int) -> dict:
    """smaps_rollup (kB) and VmHWM / Threads of one process, with a short label."""
    mem: dict = {"pid": pid}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        if rest.strip().endswith("kB"):
            mem[key] = int(rest.split()[0])
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmHWM", "Threads"):
            mem[key] = int(rest.split()[0])
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    mem["label"] = label(pid, [a.decode(errors="replace") for a in argv if a])
    return mem


def label(pid: int, argv: list[str]) -> str:
    cmd = " ".join(argv)
    if "tritonserver" in cmd and "stub" not in cmd:
        return "tritonserver"
    if "triton_python_backend_stub" in cmd:
        model = re.search(r"/([^/ ]+)/1/model\.py", cmd)
        return f"python-backend stub ({model.group(1) if model else '?'})"
    if "serving.cli" in cmd or "mmc-serve" in cmd:
        workers = re.findall(r"--workers (\S+)", cmd)
        if "-m serving.cli" in cmd:
            return "worker"
        return "worker (alone)" if workers and workers[-1] == "1" else "supervisor"
    return Path(argv[0]).name if argv else str(pid)


def tree_memory(root: int) -> list[dict]:
    return [proc_memory(pid) for pid in tree_pids(root)]


ARENA = 64 * 1024  # kB: glibc reserves each thread arena's heap as 64 MiB, 64 MiB-aligned


def mapping_groups(pid: int) -> list[tuple[str, int, int, int]]:
    """The process's mappings grouped by what they are: (group, RSS kB, PSS kB, count), largest
    first. Anonymous mappings are told apart by shape: a thread arena is a mapping at a 64
    MiB-aligned address (its used part, the rest reserved with no access; with the mappings
    that follow it inside those 64 MiB, where madvise split it); a Python object arena
    is one of exactly 1 MiB (CPython 3.10+); anything else anonymous is a large malloc block or a
    library's own buffer (glibc mmaps blocks over its threshold), or a thread's stack."""
    rows = smaps_rows(pid)
    groups: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    arena = -1  # the 64 MiB-aligned start of the last thread arena seen
    for r in rows:
        if not r["path"] and r["start"] % (ARENA * 1024) == 0:
            arena = r["start"]
        # numpy's madvise(MADV_HUGEPAGE) on large arrays splits an arena into several mappings
        r["in_arena"] = not r["path"] and arena <= r["start"] < arena + ARENA * 1024
        name = group_of(r)
        g = groups[name]
        g[0] += r["Rss"]
        g[1] += r["Pss"]
        g[2] += 1
    return sorted(((k, *v) for k, v in groups.items()), key=lambda t: -t[1])


def smaps_rows(pid: int) -> list[dict]:
    """One dict per mapping of /proc/<pid>/smaps: start, kb (size), perm, path, Rss, Pss."""
    rows = []
    head = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$")
    cur: dict | None = None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        m = head.match(line)
        if m:
            start, end = int(m.group(1), 16), int(m.group(2), 16)
            cur = {"start": start, "kb": (end - start) // 1024, "perm": m.group(3),
                   "path": m.group(4).strip(), "Rss": 0, "Pss": 0}
            rows.append(cur)
        elif cur is not None and line.startswith(("Rss:", "Pss:")):
            key, value = line.split(":")
            cur[key] = int(value.split()[0])
    return rows


def group_of(r: dict) -> str:
    path = r["path"]
    if path == "[heap]":
        return "malloc main heap ([heap])"
    if path.startswith("[stack"):
        return "main thread stack"
    if path.startswith("["):
        return "kernel ([vdso], [vvar], ...)"
    if not path:
        if r.get("in_arena"):
            return "malloc thread arenas (64 MiB-aligned heaps)"
        if r["kb"] == 1024 and r["perm"].startswith("rw"):
            return "Python object arenas (1 MiB)"
        return "other anonymous (large malloc blocks, library buffers, thread stacks)"
    site = re.search(r"site-packages/([^/]+)", path)
    if site:
        name = re.sub(r"(\.libs|-[\d.]+\.dist-info|\.cpython.*|\.abi3.*)$", "", site.group(1))
        if name in ("numpy", "numpy.libs") or "openblas" in path:
            return "numpy + OpenBLAS (site-packages)"
        return f"{name} (site-packages)"
    if "/tritonserver/" in path or "nvidia_pytriton" in path:
        return "tritonserver + its libraries (wheel)"
    if "libpython" in path or "/lib/python3" in path:
        return "Python (libpython, lib-dynload)"
    if path.startswith("/usr/lib") or path.startswith("/lib"):
        return "system libraries (/usr/lib: libc, libstdc++, libssl, ...)"
    return "other files"


def distinct_pages_kb(pids: list[int]) -> int | None:
    """The physical pages the tree maps, each counted once however many of its processes map
    it (/proc/<pid>/pagemap, present pages' frame numbers; needs root): its PSS were it alone
    on the machine, which other processes mapping the same libraries (a test suite on the same
    .venv) do not lower. None when the frame numbers are hidden (not root)."""
    frames: set[int] = set()
    head = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) ")
    page = os.sysconf("SC_PAGE_SIZE")
    for pid in pids:
        ranges, start, end = [], 0, 0
        try:
            for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
                m = head.match(line)
                if m:
                    start, end = int(m.group(1), 16), int(m.group(2), 16)
                elif line.startswith("Rss:") and int(line.split()[1]) > 0:
                    ranges.append((start, end))
            with open(f"/proc/{pid}/pagemap", "rb") as f:
                for start, end in ranges:
                    f.seek(start // page * 8)
                    data = f.read((end - start) // page * 8)
                    for (entry,) in struct.iter_unpack("<Q", data):
                        if entry >> 63:  # present
                            frames.add(entry & ((1 << 55) - 1))
        except OSError:
            return None
    if frames == {0}:
        return None
    return len(frames) * page // 1024


def trim_and_read(procs: list[dict]) -> int | None:
    """Sum of the tree's RSS (kB) after malloc_trim(0) in each process (gdb attaches, calls it,
    detaches): memory malloc held as free, given back. None without gdb or when it fails."""
    if not shutil.which("gdb"):
        return None
    total = 0
    for p in procs:
        r = subprocess.run(["gdb", "-p", str(p["pid"]), "-batch", "-nx",
                            "-ex", "call (int)malloc_trim(0)"],
                           capture_output=True, text=True, timeout=120)
        if "= 1" not in r.stdout and "= 0" not in r.stdout:
            return None
        total += proc_memory(p["pid"])["Rss"]
    return total


def outside_sharers(pids: list[int], path_part: str) -> tuple[str, int]:
    """The largest file the tree maps whose path contains `path_part`, and how many processes
    outside the tree map that same file (they take part of its pages' PSS)."""
    sizes: dict[str, int] = collections.defaultdict(int)
    for pid in pids:
        for r in smaps_rows(pid):
            if path_part in r["path"]:
                sizes[r["path"]] += r["Rss"]
    if not sizes:
        return "", 0
    path = max(sizes, key=sizes.get)
    mine, n = set(pids), 0
    for maps in Path("/proc").glob("[0-9]*/maps"):
        if int(maps.parent.name) in mine:
            continue
        try:
            if path in maps.read_text():
                n += 1
        except OSError:
            continue
    return path, n


# --------------------------------------------------------------------------------------------
# Starting servers and sending requests
# --------------------------------------------------------------------------------------------

#: Run with .venv's Python: bench/serving.py's models and request bodies (with onnxruntime's
#: reference outputs) in a process of its own, so that this one does not map .venv's
#: onnxruntime and take part of ours' PSS.
PREPARE_PY = """
import dataclasses, importlib.util, json, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("bench_serving", sys.argv[1])
bs = sys.modules["bench_serving"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bs)
work = Path(sys.argv[2])
models = bs.build_models(work)
reqs = bs.make_requests(work, models)
print(json.dumps({"models": {k: str(v) for k, v in models.items()},
                  "requests": [[m, b, str(r.body_file), r.header_len, r.reference]
                               for (m, b), r in reqs.items()]}))
"""


def prepare(work: Path) -> tuple[dict[str, Path], dict]:
    """bs.build_models and bs.make_requests, run in a child process (see PREPARE_PY)."""
    p = subprocess.run([bs.OUR_PY, "-c", PREPARE_PY, REPO / "bench" / "serving.py", work],
                       capture_output=True, text=True, check=True)
    out = json.loads(p.stdout)
    reqs = {(m, b): bs.Request(Path(f), n, ref) for m, b, f, n, ref in out["requests"]}
    return {k: Path(v) for k, v in out["models"].items()}, reqs


def launch_for(name: str, work: Path, models: dict[str, Path], port: int, args):
    env = dict(args.ours_env)
    if name == "triton":
        if not bs.PEER_PY.exists():
            raise bs.ServerFailed(f"{bs.PEER_VENV} is missing: `python3 bench/serving.py` "
                                  "creates it")
        p = subprocess.run([bs.PEER_PY, "-c", TRITON_LAUNCH_PY, REPO / "bench" / "serving.py",
                            work, json.dumps({k: str(v) for k, v in models.items()}), str(port),
                            str(args.ort_threads), str(args.triton_delay_us)],
                           capture_output=True, text=True, check=True)
        return bs.Launch(**json.loads(p.stdout))
    checkout = Path(args.before).resolve() if name == "before-1" else None
    workers = None if name == "ours-auto" else 1
    launch = bs.setup_ours(work, models, port, args.ort_threads, checkout=checkout,
                           workers=workers, extra_env=env)
    if name != "ours-1-grpc":  # setup_ours always opens the gRPC front; mmc-serve's default is off
        i = launch.cmd.index("--grpc-port")
        del launch.cmd[i:i + 2]
        launch = dataclasses.replace(launch, grpc_port=None)
    return launch


def send(url: str, req, binary: bool, total: int, conc: int) -> tuple[int, float]:
    """`total` POSTs of one body from `conc` threads (httpx keep-alive clients); returns
    (failed answers, seconds)."""
    body = req.body_file.read_bytes()
    headers = {"Content-Type": "application/octet-stream" if binary else "application/json"}
    if req.header_len is not None:
        headers["Inference-Header-Content-Length"] = str(req.header_len)
    left, failed, lock = [total], [0], threading.Lock()

    def run() -> None:
        with httpx.Client(timeout=60) as client:
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                try:
                    ok = client.post(url, content=body, headers=headers).status_code == 200
                except httpx.HTTPError:
                    ok = False
                if not ok:
                    with lock:
                        failed[0] += 1

    t0 = time.perf_counter()
    threads = [threading.Thread(target=run) for _ in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return failed[0], time.perf_counter() - t0


def exercise(srv, reqs: dict, grpc_bodies: dict, args, notes: list[str]) -> None:
    """Warm-up (checked answers), then the requests of every HTTP scenario, then gRPC calls
    where the server has a gRPC front. `--requests 0 --warmup 0`: none (the idle reading)."""
    for name in HTTP_SCENARIOS:
        sc = bs.SCENARIOS[name]
        req = reqs[(sc.model, sc.binary)]
        for _ in range(args.warmup):
            bs.check_by_hand(srv, sc, req)
        if not args.requests:
            continue
        cpu0 = bs.group_cpu_seconds(srv.proc.pid)
        failed, took = send(srv.url(f"/v2/models/{sc.model}/infer"), req, sc.binary,
                            args.requests, sc.conc)
        cpu = (bs.group_cpu_seconds(srv.proc.pid) - cpu0) * 1e6 / args.requests
        srv.cpu_us[name] = cpu
        log(f"  {name}: {args.requests} requests, c={sc.conc}, {took:.1f} s, failed {failed}, "
            f"server CPU {cpu:,.0f} µs/request")
        if failed:
            notes.append(f"{srv.name} {name}: {failed} of {args.requests} answers failed")
    if srv.grpc_port is None or not args.requests:
        return
    address = f"127.0.0.1:{srv.grpc_port}"
    for name in GRPC_SCENARIOS:
        sc = bs.SCENARIOS[name]
        bs.grpc_check_by_hand(address, sc, grpc_bodies[sc.model],
                              reqs[(sc.model, True)].reference)
        res = bs.run_h2load(address, sc, grpc_bodies[sc.model], 10.0, None, srv.work,
                            calls=args.requests)
        log(f"  {name}: {res['calls']} gRPC calls, c={sc.conc}, failed {res['failed']}")
        if res["failed"]:
            notes.append(f"{srv.name} {name}: {res['failed']} gRPC calls failed")


def measure(name: str, work: Path, models: dict[str, Path], reqs: dict, grpc_bodies: dict,
            args, notes: list[str], versions: dict[str, str]) -> dict | None:
    log(f"[{name}] starting")
    port = bs.free_port()
    try:
        launch = launch_for(name, work, models, port, args)
        srv = bs.Running(name, launch, port, work, None)
    except (bs.ServerFailed, subprocess.CalledProcessError) as e:
        log(f"  ERROR: {e}")
        notes.append(f"{name} did not start: {str(e).splitlines()[0]}")
        return None
    srv.work = work  # run_h2load's log folder
    srv.cpu_us = {}
    try:
        versions.setdefault(name.split("-")[0] + " /v2", srv.server_version())
        exercise(srv, reqs, grpc_bodies, args, notes)
        time.sleep(args.settle)
        procs = tree_memory(srv.proc.pid)
        distinct = distinct_pages_kb([p["pid"] for p in procs])
        biggest = max(procs, key=lambda p: p.get("Rss", 0))
        groups = mapping_groups(biggest["pid"])
        probe = "tritonserver" if name == "triton" else "onnxruntime"
        sharers = outside_sharers([p["pid"] for p in procs], probe)
        trimmed = trim_and_read(procs) if args.trim else None
    except (bs.ServerFailed, OSError, subprocess.SubprocessError) as e:
        log(f"  ERROR: {e}")
        notes.append(f"{name} FAILED: {str(e).splitlines()[0]}")
        return None
    finally:
        srv.stop()
    total = {k: sum(p.get(k, 0) for p in procs) for k in
             ("Rss", "Pss", "Pss_Anon", "Pss_File", "VmHWM")}
    total["distinct"] = distinct
    total["trimmed"] = trimmed
    log(f"  {len(procs)} process(es): RSS {total['Rss'] / MB:.0f} MB, PSS "
        f"{total['Pss'] / MB:.0f} MB (RSS " + " + ".join(f"{p['Rss'] / MB:.0f}" for p in procs)
        + " MB)")
    return {"procs": procs, "total": total, "groups": groups, "biggest": biggest,
            "sharers": sharers, "probe": probe, "cpu_us": srv.cpu_us}


# --------------------------------------------------------------------------------------------
# What a worker imports
# --------------------------------------------------------------------------------------------

def probe_modules(work: Path, models: dict[str, Path], reqs: dict, args) -> dict:
    """sys.modules of a `--workers 1` server (gRPC off) after one request per model, its
    -X importtime lines, and each top-level package's RSS when imported in that order."""
    port = bs.free_port()
    launch = launch_for("ours-1", work, models, port, args)
    argv = launch.cmd[1:]  # mmc-serve's own arguments
    out = work / "probe.json"
    bodies = [["mlp", str(reqs[("mlp", False)].body_file), None],
              ["conv", str(reqs[("conv", True)].body_file), reqs[("conv", True)].header_len]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **launch.env,
           "PYTHONPATH": str(REPO)}
    p = subprocess.run([bs.OUR_PY, "-X", "importtime", "-c", PROBE_PY, str(out), str(port),
                        json.dumps(argv), json.dumps(bodies)], env=env, cwd=work,
                       capture_output=True, text=True, timeout=120)
    if not out.exists():
        raise bs.ServerFailed(f"probe failed ({p.returncode}): {p.stderr[-1500:]}")
    found = json.loads(out.read_text())
    seen: list[str] = []
    for mod in found["modules"]:
        top = mod.split(".")[0]
        if top not in seen and not top.startswith("_") and top not in sys.builtin_module_names:
            seen.append(top)
    times: dict[str, int] = {}  # a package's first (and only) import, at whatever depth
    for line in p.stderr.splitlines():  # "import time: self [us] | cumulative | imported package"
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|\s+(\S+)$", line)
        if m:
            times.setdefault(m.group(2), int(m.group(1)))
    files = found["files"]
    third_party = [m for m in seen if "site-packages" in (files.get(m) or "")
                   or (files.get(m) or "").startswith(str(REPO))]
    # then what a package imports later, on its own: uvicorn's websocket protocol (ws "auto"
    # loads it at startup) and the rest of the app
    later = [m for m in LATER_MODULES if m in found["modules"]]
    cost = json.loads(subprocess.run(
        [bs.OUR_PY, "-c", IMPORT_COST_PY, json.dumps(third_party + later)],
        env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO, capture_output=True, text=True,
        check=True).stdout)
    watched = {name: what for name, what in WATCHED.items()
               if any(m == name or m.startswith(name + ".") for m in found["modules"])}
    return {"modules": found["modules"], "statuses": found["statuses"], "top": seen,
            "third_party": third_party, "cost": cost, "watched": watched, "times": times}


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------

def render(args, results: dict, probe: dict | None, notes: list[str], versions: dict) -> str:
    tri = results.get("triton")
    t = tri["total"] if tri else {}
    tri_pss, tri_rss, tri_own = t.get("Pss"), t.get("Rss"), t.get("distinct")
    lines = [
        "# Memory (bench/memory.py)", "",
        f"- date: {dt.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
        f"- machine: {bs.machine()}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        f"- load per server, after {args.warmup} checked answer(s) per scenario: {args.requests} "
        "requests each of MLP v2 JSON (c=32), conv binary (c=8), conv v2 JSON (c=8) over httpx "
        f"keep-alive, and {args.requests} gRPC ModelInfer calls per model (h2load) where the "
        f"server listens for gRPC; read {args.settle:g} s after the last answer; one server up "
        "at a time; onnxruntime intra_op 1, inter_op 1; Triton dynamic batching "
        f"{args.triton_delay_us} µs; ours: config.json max_batch_size 32 / 8"
        + (f"; ours' environment: {' '.join(f'{k}={v}' for k, v in args.ours_env.items())}"
           if args.ours_env else ""),
        "- RSS counts every page a process maps in full; PSS divides a shared page among the "
        "processes that map it (the tree's libraries, Python and the models' weights count once "
        "across its processes). Sums are over the server's whole process tree.", "",
        "## Process trees (MB)", "",
        "| server | processes | RSS | PSS | PSS anon | PSS file | own pages | peak RSS (sum of "
        "VmHWM) | PSS vs Triton | own pages vs Triton | RSS vs Triton"
        + (" | RSS after malloc_trim |" if args.trim else " |"),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if args.trim else ""),
    ]
    for name, r in results.items():
        if r is None:
            lines.append(f"| {name} | failed (see notes) | | | | | | | | | |")
            continue
        t = r["total"]
        own = f"{t['distinct'] / MB:.0f}" if t["distinct"] else "?"
        lines.append(
            f"| {name} | {len(r['procs'])} | {t['Rss'] / MB:.0f} | {t['Pss'] / MB:.0f} | "
            f"{t['Pss_Anon'] / MB:.0f} | {t['Pss_File'] / MB:.0f} | {own} | "
            f"{t['VmHWM'] / MB:.0f} | {bs.fmt_ratio(t['Pss'], tri_pss)} | "
            f"{bs.fmt_ratio(t['distinct'], tri_own)} | {bs.fmt_ratio(t['Rss'], tri_rss)} |"
            + (f" {t['trimmed'] / MB:.0f} |" if t.get("trimmed") else " ? |" if args.trim else ""))
    lines += ["", "Own pages: the physical pages the tree maps, each once however many of its "
              "processes map it (/proc/<pid>/pagemap): its PSS were it alone on the machine. "
              "PSS is lower than that where other processes map the same files (a test suite "
              "on the same .venv: see each server's count below); Triton's peer venv and "
              "binary are its own."]
    lines += ["", "## Per process (MB)", "",
              "| server | process | threads | RSS | PSS | PSS anon | PSS file | peak RSS |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        for p in (r or {}).get("procs", []):
            lines.append(
                f"| {name} | {p['label']} | {p.get('Threads', 0)} | {p.get('Rss', 0) / MB:.1f} | "
                f"{p.get('Pss', 0) / MB:.1f} | {p.get('Pss_Anon', 0) / MB:.1f} | "
                f"{p.get('Pss_File', 0) / MB:.1f} | {p.get('VmHWM', 0) / MB:.1f} |")
    lines += ["", "## Server CPU per request during the load (µs; user + system of the tree)", "",
              "| server | " + " | ".join(HTTP_SCENARIOS) + " |",
              "|---|" + "---:|" * len(HTTP_SCENARIOS)]
    for name, r in results.items():
        if r is not None:
            lines.append(f"| {name} | " + " | ".join(
                f"{r['cpu_us'].get(sc, 0):,.0f}" for sc in HTTP_SCENARIOS) + " |")
    for name, r in results.items():
        if r is None:
            continue
        lines += ["", f"## {name}: where its largest process's memory is "
                  f"({r['biggest']['label']}, MB)", "",
                  "| mappings | RSS | PSS | count |", "|---|---:|---:|---:|"]
        shown = [g for g in r["groups"] if g[1] >= 512]
        rest = [g for g in r["groups"] if g[1] < 512]
        lines += [f"| {g} | {rss / MB:.1f} | {pss / MB:.1f} | {n} |" for g, rss, pss, n in shown]
        if rest:
            lines.append(f"| {len(rest)} more groups, each under 0.5 MB | "
                         f"{sum(g[1] for g in rest) / MB:.1f} | "
                         f"{sum(g[2] for g in rest) / MB:.1f} | {sum(g[3] for g in rest)} |")
        path, n = r["sharers"]
        lines.append(f"\nOther processes mapping `{Path(path).name}` (this tree's) at the reading: "
                     f"{n} (they take part of its pages' PSS).")
    if probe:
        lines += ["", "## What `mmc-serve --workers 1` (gRPC off) imports", "",
                  f"After one request per model (answers {', '.join(probe['statuses'])}): "
                  f"{len(probe['modules'])} modules, top-level packages from site-packages and "
                  "the repo in import order: " + ", ".join(probe["third_party"]) + ".", "",
                  "Of the watched ones (feature: loaded): " + "; ".join(
                      f"`{k}` {v}" for k, v in probe["watched"].items()) + ". Not loaded: "
                  + ", ".join(f"`{k}`" for k in WATCHED if k not in probe["watched"]) + ".", "",
                  "RSS each adds when imported alone, in that order into one fresh interpreter "
                  "(what a package shares with an earlier one is the earlier one's), with its "
                  "-X importtime cumulative ms in the worker:", "",
                  "| import | RSS MB | import ms |", "|---|---:|---:|"]
        for mod, kb in probe["cost"]:
            ms = probe["times"].get(mod.split(" ")[0])
            lines.append(f"| {mod} | {kb / MB:.1f} | {f'{ms / 1000:.0f}' if ms else ''} |")
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="ours-1,ours-auto,ours-1-grpc,triton",
                   help=f"comma list of {','.join(SERVERS)}")
    p.add_argument("--requests", type=int, default=200,
                   help="requests per HTTP scenario, and gRPC calls per model")
    p.add_argument("--warmup", type=int, default=3, help="checked answers per scenario first "
                   "(with --requests 0 --warmup 0: the memory of a server that answered nothing)")
    p.add_argument("--settle", type=float, default=3.0, help="seconds before reading memory")
    p.add_argument("--before", default="", help="another checkout of this repo: adds before-1")
    p.add_argument("--ours-env", action="append", default=[], metavar="NAME=VALUE",
                   help="an environment setting for ours and before (repeatable), e.g. "
                        "MALLOC_ARENA_MAX=2")
    p.add_argument("--ort-threads", type=int, default=1)
    p.add_argument("--triton-delay-us", type=int, default=500)
    p.add_argument("--no-probe", action="store_true", help="skip the sys.modules probe")
    p.add_argument("--trim", action="store_true",
                   help="after the reading, call glibc's malloc_trim(0) in every process of the "
                        "tree (gdb) and read its RSS again: how much was freed memory that "
                        "malloc kept")
    p.add_argument("--output", default=str(RESULTS))
    a = p.parse_args(argv)
    a.servers = [s.strip() for s in a.only.split(",") if s.strip()]
    if a.before and "before-1" not in a.servers:
        a.servers.append("before-1")
    bad = [s for s in a.servers if s not in SERVERS]
    if bad:
        p.error(f"unknown server(s): {', '.join(bad)}")
    if "before-1" in a.servers and not a.before:
        p.error("before-1 needs --before DIR")
    if any("=" not in kv for kv in a.ours_env):
        p.error("--ours-env wants NAME=VALUE")
    a.ours_env = dict(kv.split("=", 1) for kv in a.ours_env)
    return a


def main() -> int:
    args = parse_args(sys.argv[1:])
    log(f"[memory] {bs.machine()}")
    notes: list[str] = []
    versions = {"onnxruntime (ours)": bs.ours_ort_version()}
    results: dict[str, dict | None] = {}
    probe = None
    with tempfile.TemporaryDirectory(prefix="mmc-memory-") as tmp:
        work = Path(tmp)
        models, reqs = prepare(work)
        grpc_bodies = bs.grpc_bodies(work) if {"ours-1-grpc", "triton"} & set(args.servers) \
            else {}
        for name in SERVERS:
            if name in args.servers:
                results[name] = measure(name, work, models, reqs, grpc_bodies, args, notes,
                                        versions)
        if not args.no_probe:
            log("[probe] mmc-serve --workers 1 in a process of its own: sys.modules")
            try:
                probe = probe_modules(work, models, reqs, args)
            except (bs.ServerFailed, subprocess.SubprocessError) as e:
                notes.append(f"probe failed: {str(e)[:300]}")
    report = render(args, results, probe, notes, versions)
    print()
    print(report)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    log(f"[memory] written to {out}")
    return 1 if any(r is None for r in results.values()) or notes else 0


if __name__ == "__main__":
    sys.exit(main())
