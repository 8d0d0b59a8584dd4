"""The CLI's HTTP client and its one error type: every command talks to the REST API through
`Client.call`, and any failure becomes a `CliError` the entry point prints."""

from __future__ import annotations

import json

import httpx


class CliError(Exception):
    pass


class Client:
    def __init__(self, url: str, token: str | None, timeout: float = 60.0):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url.rstrip("/") + "/api/v1/", headers=headers,
                                 timeout=timeout)

    def call(self, method: str, path: str, **kwargs) -> dict | list | None:
        try:
            r = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach {self.http.base_url}: {exc}") from None
        if r.status_code >= 400:
            try:
                message = r.json().get("error", r.text)
            except ValueError:
                message = r.text
            raise CliError(f"{r.status_code}: {message}")
        return r.json() if r.content else None


def print_json(data) -> None:
    print(json.dumps(data, indent=2, default=str))
