"""The client's one way to the REST API: where it is and with which token (mmc.config), a JSON
call that turns a refusal into its typed error, every page of a list, a body streamed from a
file with progress, and a download written to its final name only once complete."""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Self

import httpx

from mmc import config
from mmc.errors import ConnectionFailed, MmcError, error_for
from mmc.resources import Download

#: progress(sent_bytes, total_bytes): called as an upload's body goes out; total is None when
#: the size of a file object cannot be known in advance.
Progress = Callable[[int, int | None], None]
#: What an upload reads: a path, an open binary file (read from where it stands), or bytes.
Source = str | os.PathLike[str] | IO[bytes] | bytes
Params = Mapping[str, Any] | list[tuple[str, Any]] | None

CHUNK = 1024 * 1024


class Transport:
    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 60.0,
                 *, transport: httpx.BaseTransport | None = None):
        """`url` and `token` default as the CLI's do: MMC_URL/MMC_TOKEN, else what `mmc login`
        saved (its token only for its own server). `transport`: another httpx transport (tests,
        proxies, an in-process app)."""
        creds = config.resolve(url=url, token=token)
        self.url = creds.url
        self.http = httpx.Client(base_url=creds.url + "/api/v1/", timeout=timeout,
                                 transport=transport)
        self._use_token(creds.token)

    def _use_token(self, token: str | None) -> None:
        if token:
            self.http.headers["Authorization"] = f"Bearer {token}"
        else:
            self.http.headers.pop("Authorization", None)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # -- requests --------------------------------------------------------------------------

    def _send(self, request: httpx.Request, *, stream: bool = False) -> httpx.Response:
        try:
            response = self.http.send(request, stream=stream)
        except httpx.HTTPError as exc:
            raise ConnectionFailed(f"cannot reach {self.http.base_url}: {exc}") from None
        if response.status_code >= 400:
            try:
                body = response.read()
            except httpx.HTTPError:
                body = b""
            finally:
                response.close()
            raise error_for(response.status_code, body, response.headers)
        return response

    def _call(self, method: str, path: str, *, params: Params = None, json: Any = None,
              content: bytes | Iterator[bytes] | None = None,
              headers: Mapping[str, str] | None = None, anonymous: bool = False,
              holds: float | None = None) -> Any:
        """The answer's JSON (None for an empty one). `anonymous`: without the token; `holds`:
        seconds the server may hold the answer back (?wait=), added to the read timeout."""
        timeout = self.http.timeout
        if holds:
            read = None if timeout.read is None else timeout.read + holds
            timeout = httpx.Timeout(**{**timeout.as_dict(), "read": read})
        request = self.http.build_request(method, path, params=_clean(params), json=json,
                                          content=content, headers=headers, timeout=timeout)
        if anonymous:
            request.headers.pop("Authorization", None)
        response = self._send(request)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise MmcError(f"the answer to {method} {request.url} is not JSON",
                           status=response.status_code, payload=response.text) from None

    def _pages(self, path: str, params: Params = None) -> Iterator[dict[str, Any]]:
        """Every item of a paginated list, page after page (asked of our own URL, never of the
        `next` link an answer names)."""
        base = list(_clean(params).items()) if isinstance(params, Mapping) else list(params or [])
        page = 1
        while True:
            answer = self._call("GET", path, params=[*base, *([("page", page)] if page > 1
                                                               else [])])
            yield from answer.get("results", []) if isinstance(answer, dict) else answer or []
            if not isinstance(answer, dict) or not answer.get("next"):
                return
            page += 1

    # -- bodies and files ------------------------------------------------------------------

    def _upload(self, method: str, path: str, source: Source, *, params: Params = None,
                headers: Mapping[str, str] | None = None,
                progress: Progress | None = None) -> Any:
        """Send `source` as the raw request body, streamed, with Content-Length when its size is
        known; progress(sent, total) after each chunk."""
        with _opened(source) as (f, total):
            sent_headers = {"Content-Type": "application/octet-stream", **(headers or {})}
            if total is not None:
                sent_headers["Content-Length"] = str(total)
            return self._call(method, path, params=params, headers=sent_headers,
                              content=_chunks(f, total, progress))

    def _download(self, path: str, dest: str | os.PathLike[str], *, params: Params = None,
                  what: str = "download") -> Download:
        """Stream `path` into `dest`, written as `dest`.part and renamed once complete: a refusal
        or a broken connection leaves no file behind."""
        dest = Path(dest)
        partial = dest.with_name(dest.name + ".part")
        response = self._send(self.http.build_request("GET", path, params=_clean(params)),
                              stream=True)
        try:
            with partial.open("wb") as f:
                for chunk in response.iter_bytes(CHUNK):
                    f.write(chunk)
            partial.replace(dest)
        except httpx.HTTPError as exc:
            raise ConnectionFailed(f"{what} failed: {exc}") from None
        finally:
            response.close()
            partial.unlink(missing_ok=True)
        return Download(path=dest, size_bytes=dest.stat().st_size,
                        headers=dict(response.headers))


def _clean(params: Params) -> Any:
    """Query parameters without the ones left out (None)."""
    if isinstance(params, Mapping):
        return {k: v for k, v in params.items() if v is not None}
    return params


@contextmanager
def _opened(source: Source) -> Iterator[tuple[IO[bytes], int | None]]:
    if isinstance(source, bytes | bytearray | memoryview):
        yield io.BytesIO(bytes(source)), len(source)
    elif isinstance(source, str | os.PathLike):
        with open(source, "rb") as f:
            yield f, os.fstat(f.fileno()).st_size
    else:
        yield source, _remaining(source)


def _remaining(f: IO[bytes]) -> int | None:
    try:
        if not f.seekable():
            return None
        here = f.tell()
        end = f.seek(0, os.SEEK_END)
        f.seek(here)
        return end - here
    except (AttributeError, OSError, ValueError):
        return None


def _chunks(f: IO[bytes], total: int | None, progress: Progress | None) -> Iterator[bytes]:
    sent = 0
    while chunk := f.read(CHUNK):
        yield chunk
        sent += len(chunk)
        if progress is not None:
            progress(sent, total)
    if progress is not None and sent == 0:
        progress(0, total)


def filename_of(source: Source, filename: str | None) -> str:
    """The name an upload is stored under: the one given, else the file's own."""
    if filename:
        return filename
    if isinstance(source, str | os.PathLike):
        return Path(source).name
    name = getattr(source, "name", None)
    return Path(name).name if isinstance(name, str) else ""

