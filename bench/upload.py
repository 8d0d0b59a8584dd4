"""Upload throughput and server memory: a large file through the REST API vs a plain copy.

    .venv/bin/python bench/upload.py [--mb 500] [--store file|s3]

Starts the embedded server (console + API) on a fresh data folder, uploads a random file of
--mb megabytes with a raw-body PUT and with multipart, and reports MB/s as a ratio to copying the
same file on the same disk (read + write + fsync, as the store does), and the server's peak RSS
growth during the upload (VmHWM - VmRSS before; target < 64 MB), and the server's CPU time per
GB uploaded (what a shared, noisy machine does not inflate).

--store s3 puts the artifacts in an S3-compatible object store instead of the folder: a moto
server (the dev extra's `moto[server]`) started on a free 127.0.0.1 port, in memory, on the same
machine; the upload then streams as 8 MiB multipart parts and is copied to its content key.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def cpu_seconds(pid: int) -> float:
    """User + system CPU the process (all its threads) has used: unlike MB/s, other tenants of
    a shared machine do not inflate it."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def reset_peak(pid: int) -> None:
    """Linux >= 4.0: writing 5 to clear_refs resets VmHWM to the current RSS."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        pass


def plain_copy(src: Path, dst: Path) -> float:
    t0 = time.perf_counter()
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        shutil.copyfileobj(fi, fo, 1024 * 1024)
        fo.flush()
        os.fsync(fo.fileno())
    return time.perf_counter() - t0


def start_moto(env: dict, data_dir: Path) -> subprocess.Popen:
    """A moto S3 server with one bucket; `env` then selects it (ARTIFACT_STORE and friends)."""
    port = free_port()
    env.update(ARTIFACT_STORE="s3://mmc-bench/artifacts", AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
               AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
               AWS_DEFAULT_REGION="us-east-1")
    moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], env=env, stdout=open(data_dir / "moto.log", "wb"),
                            stderr=subprocess.STDOUT)
    for _ in range(100):
        try:
            httpx.get(env["AWS_ENDPOINT_URL"] + "/moto-api/", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    import boto3

    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id="bench",
                 aws_secret_access_key="bench", region_name="us-east-1").create_bucket(
        Bucket="mmc-bench")
    return moto


def chunks(path: Path, size: int = 1024 * 1024):
    with open(path, "rb") as f:
        while block := f.read(size):
            yield block


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=500)
    ap.add_argument("--store", choices=("file", "s3"), default="file")
    args = ap.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix="mmc-bench-upload-"))
    env = {**os.environ, "MMC_DATA_DIR": str(data_dir), "DJANGO_SETTINGS_MODULE":
           "console.settings", "MMC_MAX_UPLOAD_BYTES": str(4 * 1024**3)}
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    moto = start_moto(env, data_dir) if args.store == "s3" else None
    subprocess.run([sys.executable, "manage.py", "start", "--no-demo", "--no-serve"], cwd=REPO,
                   env=env, check=True, capture_output=True)
    token = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c",
         "from registry.services import token_create, model_create;"
         "from registry.audit import Actor;a=Actor.system('bench');"
         "model_create(name='big', actor=a);"
         "print(token_create(username='admin', name='bench', actor=a)[1])"],
        cwd=REPO, env=env, check=True, capture_output=True, text=True).stdout.strip().split()[-1]
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "console.asgi:application", "--port", str(port),
         "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning"],
        cwd=REPO, env={**env, "MMC_EMBED_SERVING": "0"})
    src = data_dir / "payload.bin"
    with open(src, "wb") as f:
        for _ in range(args.mb):
            f.write(os.urandom(1024 * 1024))
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                httpx.get(base + "/api/v1/models/", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        headers = {"Authorization": f"Bearer {token}"}
        copy_s = min(plain_copy(src, data_dir / f"copy{i}.bin") for i in range(2))
        for i in range(2):
            (data_dir / f"copy{i}.bin").unlink()
        rows = []
        for kind in ("raw PUT", "multipart"):
            # distinct bytes per run, so the second upload is not a deduplicated no-op
            with open(src, "r+b") as f:
                f.write(os.urandom(16))
            time.sleep(1)
            rss0 = proc_kb(server.pid, "VmRSS")
            reset_peak(server.pid)
            cpu0 = cpu_seconds(server.pid)
            t0 = time.perf_counter()
            with httpx.Client(base_url=base, headers=headers, timeout=600) as http:
                if kind == "raw PUT":
                    r = http.put("/api/v1/models/big/versions/upload/?filename=payload.bin",
                                 content=chunks(src),
                                 headers={"Content-Type": "application/octet-stream",
                                          "Content-Length": str(src.stat().st_size)})
                else:
                    with open(src, "rb") as f:
                        r = http.post("/api/v1/models/big/versions/",
                                      files={"file": ("payload.bin", f)})
            seconds = time.perf_counter() - t0
            cpu = cpu_seconds(server.pid) - cpu0
            peak = proc_kb(server.pid, "VmHWM")
            assert r.status_code == 201, r.text
            rows.append((kind, seconds, (peak - rss0) / 1024, cpu))
        mb = src.stat().st_size / 1024**2
        if moto is not None:  # the peer: boto3's own managed upload of the same file
            import boto3

            client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"],
                                  aws_access_key_id="bench", aws_secret_access_key="bench",
                                  region_name="us-east-1")
            t0 = time.perf_counter()
            with open(src, "rb") as f:
                client.upload_fileobj(f, "mmc-bench", "ceiling/payload.bin")
            rows.insert(0, ("boto3 upload_fileobj, no server (ceiling)",
                            time.perf_counter() - t0, None, None))
        print(f"\nUpload of {mb:.0f} MB into the {args.store} store, {time.strftime('%Y-%m-%d')}, "
              f"{os.cpu_count()} cores\n")
        print("| path | MB/s | ratio to plain copy | server peak RSS growth "
              "| server CPU s per GB |")
        print("|---|---|---|---|---|")
        print(f"| plain copy + fsync | {mb / copy_s:.0f} | 1.00 | - | - |")
        for kind, seconds, growth, cpu in rows:
            rss = "-" if growth is None else f"{growth:.1f} MB"
            per_gb = "-" if cpu is None else f"{cpu * 1024 / mb:.2f}"
            print(f"| {kind} | {mb / seconds:.0f} | {copy_s / seconds:.2f} | {rss} | {per_gb} |")
    finally:
        server.terminate()
        server.wait(10)
        if moto is not None:
            moto.terminate()
            moto.wait(10)
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
