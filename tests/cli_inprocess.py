"""The real `mmc` CLI with its HTTP client on this process's Django app (no server), inside the
test's database transaction: for specs that drive a command and read what the API did."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import import_module

import httpx
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections

cli = import_module("registry.cli.main")  # the package re-exports main() only



@contextmanager
def inprocess_cli(token: str, monkeypatch, capsys) -> Iterator[Callable[..., tuple[int, str]]]:
    """Yields run(*args) -> (exit code, stderr) of `mmc --token token *args`."""

    class InProcess(cli.Client):
        def __init__(self, url, token, timeout=60.0):
            super().__init__(url, token, timeout)
            self.http = httpx.Client(transport=httpx.WSGITransport(app=WSGIHandler()),
                                     base_url="http://testserver/api/v1/",
                                     headers=self.http.headers)

    monkeypatch.setattr(cli, "Client", InProcess)
    for signal in (signals.request_started, signals.request_finished):  # as django.test.Client:
        signal.disconnect(close_old_connections)  # keep the test's transaction open

    def run(*args: str) -> tuple[int, str]:
        code = cli.main(["--url", "http://testserver", "--token", token, *args])
        return code, capsys.readouterr().err

    try:
        yield run
    finally:
        for signal in (signals.request_started, signals.request_finished):
            signal.connect(close_old_connections)
