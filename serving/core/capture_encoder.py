"""Where a replica's capture files are made: a child process that turns packed batches
(serving.core.capture_wire) into Parquet files (serving.core.capture_files) and hands them
back. The serving process only writes a buffer to a pipe and reads the files back: its
interpreter, and so its event loop, never spends the ~2 us per record of making columns, nor
the stretches of it that stalled requests when a thread of the serving process did it (p99 at
100 % sampling 2.8x capture off, bench/results/capture-2026-12-07.md). The child runs at
a lower CPU priority (nice 10) once it has imported pyarrow: where CPU is short, requests come
first and the queue, which is bounded, takes the wait (full: records dropped and counted).

Protocol, one batch at a time: the parent writes u64 length + the packed records; the child
answers u64 length + a pickle of {"files": [(model, first ts, payload, versions)],
"failed": {(model, version): records}} or {"error": "..."}. The child ends when its input
closes (the replica stopped or died). `MMC_CAPTURE_ENCODER=thread` makes the files in a
thread of the serving process instead (where a process cannot be started).

    python -m serving.core.capture_encoder      (started by the capture queue, not by hand)
"""

from __future__ import annotations

import fcntl
import logging
import os
import pickle
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable

from serving.core import capture_files, capture_wire
from serving.core.capture_files import CaptureFile

log = logging.getLogger(__name__)

ENCODERS = ("process", "thread")
#: The encoder's CPU priority once it has imported what it uses: below the serving process (a
#: tenth of a CPU's share where the two compete), not idle-only: at SCHED_IDLE it got no CPU at
#: all beside a busy machine's other work (capture stopped, a killed replica's encoder did not
#: even run to its exit). Nice 19 looked better for p99 at 100 % sampling (1.12-1.14x capture
#: off against 1.34x, single runs within the bench's noise) but beside two CPU burners stored
#: 41 of 301 records and dropped 190: not worth it (bench/results/capture-2026-12-07.md).
NICE = 10
_F_SETPIPE_SZ = 1031  # Linux: a pipe that holds a batch in one go (fewer wake-ups)
_PIPE_BYTES = 1 << 20


def encode_packed(buf, pause: Callable[[], None] = capture_files.pause,
                  ) -> tuple[list[CaptureFile], dict[tuple[str, str], int]]:
    """A packed batch as capture files, and the records that could not be written per model
    and version (logged by capture_files.encode). `pause`: see capture_files.encode."""
    columns = capture_wire.columns(buf)
    if columns is not None:  # the usual batch: written from its columns, no entry per request
        try:
            return [capture_files.encode_columns(columns, new_id=capture_wire.new_request_id,
                                                 pause=pause)], {}
        except Exception:  # noqa: BLE001 - the general way below says what is wrong, per record
            log.exception("capture: a batch not written the quick way; written record by record")
    blocks = capture_wire.unpack_blocks(buf)
    entries = capture_wire.entries(blocks)
    files, lost = capture_files.encode(entries, new_id=capture_wire.new_request_id, pause=pause)
    return files, dict(Counter((e[2], e[3]) for e in lost))


class EncoderFailed(RuntimeError):
    pass


class EncoderProcess:
    """The parent's end: started on the first batch, started again after it died (the batch
    it held is lost and counted failed by the queue)."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def _started(self) -> subprocess.Popen:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            return proc
        proc = self._proc = subprocess.Popen(
            [sys.executable, "-m", "serving.core.capture_encoder"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, close_fds=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            fcntl.fcntl(proc.stdin.fileno(), _F_SETPIPE_SZ, _PIPE_BYTES)
        except OSError:
            pass  # the default size works, in more writes
        return proc

    def encode(self, buf) -> tuple[list[CaptureFile], dict[tuple[str, str], int]]:
        with self._lock:
            proc = self._started()
            try:
                proc.stdin.write(capture_wire.U64.pack(len(buf)))
                proc.stdin.write(buf)
                proc.stdin.flush()
                reply = pickle.loads(_read_frame(proc.stdout))
            except (OSError, EOFError, ValueError, pickle.UnpicklingError) as exc:
                self._kill()
                raise EncoderFailed(f"the capture encoder process stopped answering: "
                                    f"{type(exc).__name__}: {exc}") from None
        if "error" in reply:
            raise EncoderFailed(reply["error"])
        return ([CaptureFile(model, first_ts, payload, versions)
                 for model, first_ts, payload, versions in reply["files"]], reply["failed"])

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def close(self) -> None:
        """Let the child finish and end (its input closes); killed if it does not in 10 s."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
            proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        finally:
            proc.stdout.close()


def _read_frame(stream) -> bytes:
    head = stream.read(capture_wire.U64.size)
    if len(head) < capture_wire.U64.size:
        raise EOFError("the capture encoder closed its output")
    (size,) = capture_wire.U64.unpack(head)
    body = stream.read(size)
    if len(body) < size:
        raise EOFError(f"the capture encoder's answer ended after {len(body)} of {size} bytes")
    return body


def _lower_priority() -> None:
    """Every thread of this process at NICE (a nice value is a thread's own on Linux: the
    threads pyarrow started when it was imported would stay at the parent's)."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, NICE)
        except OSError:
            pass


def _no_pause() -> None:
    """The child has no event loop to give the GIL to."""


def main() -> None:
    """The child: batches in on stdin, answers out on stdout, until stdin closes."""
    source, answers = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing printed by accident lands in the protocol
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s capture-encoder[%(process)d] %(levelname)s %(message)s")
    capture_files.arrow()  # imported at the parent's priority: starting is not the slow part
    _lower_priority()
    while True:
        try:
            buf = _read_frame(source)
        except EOFError:
            return
        try:
            files, failed = encode_packed(buf, pause=_no_pause)
            reply = {"files": [(f.model, f.first_ts, f.payload, f.versions) for f in files],
                     "failed": failed}
        except Exception as exc:  # noqa: BLE001 - one batch lost, the encoder goes on
            log.exception("a batch of capture records not encoded")
            reply = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
        out = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        answers.write(capture_wire.U64.pack(len(out)))
        answers.write(out)
        answers.flush()


if __name__ == "__main__":
    main()
