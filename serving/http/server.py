"""The HTTP server a serving process runs: uvicorn (uvloop + httptools, our hardened protocol)
with the drain on SIGTERM, for mmc-serve and for the embedded console. Imported only by a
process that serves (serving.cli.serve), never by the supervisor of several workers."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import socket
import struct
import sys
import time

import uvicorn

from serving.process import supervisor
from serving.process.supervisor import DEFAULT_DRAIN_SECONDS

log = logging.getLogger("uvicorn.error")

#: A worker takes a second signal this soon after the first for the same one (see handle_exit).
REPEAT_SECONDS = 1.0

_SO_ATTACH_FILTER = 26  # Linux <asm-generic/socket.h>
#: A classic BPF program of one instruction, `ret #0`: drop the packet.
_DROP_ALL = ctypes.create_string_buffer(struct.pack("HBBI", 0x06, 0, 0, 0))


def refuse_new_connections(listener) -> bool:
    """Make the kernel drop new connection attempts (SYNs) to `listener` while the ones it
    already completed wait in its accept queue: closing a listener resets those, after their
    clients have sent a request. A dropped SYN is sent again a second later and finds the port
    closed (a refusal its client may retry) or another process listening. Linux only: False
    elsewhere or on failure. (The drain's last step; measured by
    tests/faults/test_replica_drain.py: without it 2-3 requests of 10 restarts under load were
    lost, with it none.)"""
    if not sys.platform.startswith("linux"):
        return False
    try:
        with socket.socket(fileno=os.dup(listener.fileno())) as sock:
            sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER,
                            struct.pack("HP", 1, ctypes.addressof(_DROP_ALL)))
    except OSError as exc:
        log.warning("cannot hold off new connections: %s", exc)
        return False
    return True


class DrainingServer(uvicorn.Server):
    """On SIGTERM: stop saying ready and answer with `Connection: close` until no connection
    is open or `drain_seconds` passed; then uvicorn's shutdown (stop accepting, finish what
    is in flight, lifespan shutdown: release the models, leave the source) and the exit.

    Closing a keep-alive connection its client may be writing to at that moment loses the
    request; a drained client has closed its connections itself after its last answer.
    A second signal stops at once (uvicorn's shutdown without the window); a third forces.
    """

    def __init__(self, config, *, app=None, drain_seconds: float = 0.0,
                 held: bool = False) -> None:
        super().__init__(config)
        # Listens only once the app is ready (a worker started again while the others serve:
        # until then the kernel gives new connections to them, rather than to one that can only
        # answer "starting").
        self.held = held
        self._listen_task: asyncio.Task | None = None
        self.listen_failed = False
        self.app = app  # the ServingApp (begin_drain), if known
        self.drain_seconds = drain_seconds
        self.drain_until: float | None = None
        self._answered = 0  # requests answered by the drain's previous tick
        self._signalled_at: float | None = None

    def handle_exit(self, sig, frame) -> None:
        now = time.monotonic()
        if (self._signalled_at is not None and now - self._signalled_at < REPEAT_SECONDS
                and supervisor.is_worker()):
            return  # one stop told twice: to the process group, and passed on by the supervisor
        self._signalled_at = now
        if self.should_exit:  # already stopping: a further signal forces it
            self.force_exit = True
        draining = self.drain_until is not None
        super().handle_exit(sig, frame)  # records the signal, re-raised after the shutdown
        if (sig == signal.SIGTERM and not draining and self.started
                and self.drain_seconds > 0):
            self.should_exit = False  # not yet: on_tick ends the drain
            self.begin_drain()

    def begin_drain(self) -> None:
        self.drain_until = time.monotonic() + self.drain_seconds
        self._answered = self.server_state.total_requests
        protocol = self.config.http_protocol_class
        if hasattr(protocol, "draining"):
            protocol.draining = True
        if hasattr(self.app, "begin_drain"):
            self.app.begin_drain()
        log.info("SIGTERM: draining for at most %g s (%d connections open)",
                 self.drain_seconds, len(self.server_state.connections))

    async def startup(self, sockets=None) -> None:
        if not self.held:
            await super().startup(sockets)
            return
        await super().startup([])  # the lifespan (models start loading), no listener yet
        self._listen_task = asyncio.get_running_loop().create_task(self._listen_when_ready())

    async def _listen_when_ready(self) -> None:
        """A held worker's own SO_REUSEPORT listener, opened once its models are loaded."""
        dataplane = getattr(self.app, "dataplane", None)
        while dataplane is not None and not self.should_exit and not dataplane.ready()[0]:
            await asyncio.sleep(0.05)
        if self.should_exit or self.drain_until is not None:
            return
        config, state, app_state = self.config, self.server_state, self.lifespan.state
        try:
            sock = supervisor.reuse_port_listener(config.host, config.port, config.backlog)
        except OSError as exc:
            log.error("cannot listen on %s:%d: %s", config.host, config.port, exc)
            self.listen_failed = self.should_exit = True
            return
        self.servers.append(await asyncio.get_running_loop().create_server(
            lambda: config.http_protocol_class(config=config, server_state=state,
                                               app_state=app_state),
            sock=sock, backlog=config.backlog))

    async def shutdown(self, sockets=None) -> None:
        """Let the kernel take no new connection, accept the ones it already took (the loop
        does, given a moment), then uvicorn's shutdown closes the listener with nothing queued
        behind it (closing a listener resets what waits in its queue). A worker's socket is its
        own (SO_REUSEPORT): a new connection refused here is retried by its client and lands
        on a worker still open."""
        if not self.force_exit and any([refuse_new_connections(sock) for server in self.servers
                                        for sock in server.sockets or ()]):
            await asyncio.sleep(0.05)
        await super().shutdown(sockets)

    async def on_tick(self, counter: int) -> bool:
        """Every 0.1 s: the drain ends at its deadline, or once a tick finds no connection
        open and no request answered since the previous one (under load, with every
        answer closing its connection, "none open" alone happens between requests)."""
        until = self.drain_until
        if until is not None and not self.should_exit:
            state = self.server_state
            quiet = not state.connections and state.total_requests == self._answered
            self._answered = state.total_requests
            if quiet or time.monotonic() >= until:
                self.should_exit = True
        if (counter % 10 == 0 and self.drain_until is None and not self.should_exit
                and supervisor.supervisor_gone()):
            log.warning("the supervisor is gone: draining")
            self.handle_exit(signal.SIGTERM, None)
        return await super().on_tick(counter)


def serve(app, *, serving=None, sockets=None, held: bool = False, **options) -> None:
    """Run the ASGI `app` on uvicorn (`options`: uvicorn.Config's) with the drain on SIGTERM.
    `serving` is the ServingApp inside it (default: `app` itself); its readiness goes 503 at
    the signal and its settings.drain_seconds (MMC_DRAIN_SECONDS) bound the window. For any
    process that serves this data plane: mmc-serve, and the embedded console
    (`serve(console.asgi.application, serving=console.asgi.serving_app, ...)`). `sockets`: an
    already bound listener to serve on (a worker of serving.process.supervisor) instead of
    host:port."""
    from serving.edge_limits import raise_open_files_limit

    raise_open_files_limit()  # the connection budget counts on it (serving.edge_limits.EdgeLimits)
    serving = app if serving is None else serving
    seconds = getattr(getattr(serving, "settings", None), "drain_seconds", DEFAULT_DRAIN_SECONDS)
    server = DrainingServer(uvicorn.Config(app, **options), app=serving, drain_seconds=seconds,
                            held=held)
    try:
        server.run(sockets=sockets)
    except KeyboardInterrupt:  # the SIGINT uvicorn re-raises after its shutdown
        pass
    if not server.started or server.listen_failed:
        raise SystemExit(3)  # uvicorn's STARTUP_FAILURE


