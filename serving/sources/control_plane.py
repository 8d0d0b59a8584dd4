"""A replica that follows the control plane over HTTP, with a replica credential and no
database settings: `mmc-serve --registry https://console.example --replica-token …`.

It holds one long poll open on the replica API's desired state (the answer comes when the
revision moves, or a 304 after the wait), so `revision()` and `fetch()` read what that poll last
brought and cost nothing per reconcile. Heartbeats go to the replica API; artifacts come from it
into this host's cache (MMC_REPLICA_CACHE_DIR), checked against their sha256 before they load.
When the control plane does not answer or refuses the credential, the replica keeps serving the
table it has and says why (its readiness body and mmc_serving_degraded); it follows again as soon
as the control plane answers.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from serving.core.capture import CaptureFile
from serving.core.desired_state import DesiredState, ObservedState, VersionSpec
from serving.core.errors import Conflict, Forbidden, InvalidInput, ModelNotFound, Unauthorized
from serving.core.reconciler import LoadFailed
from serving.core.state_wire import (
    FULL_HEARTBEAT_EVERY_S,
    WireError,
    decode_desired,
    encode_observed,
)

log = logging.getLogger(__name__)

STATE = "/api/v1/replica/desired-state"
CAPTURE = "/api/v1/replica/capture"
#: How long one long poll waits on the control plane before it answers 304.
WAIT_SECONDS = 25.0
CHUNK = 1024 * 1024


class SourceUnavailable(ConnectionError):
    """The control plane did not give the desired state: unreachable, refusing, or odd."""


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mmc" / "artifacts"


def _detail(response: httpx.Response) -> str:
    """What a refusal says: its JSON `error` (or DRF's `detail`), else its text."""
    try:
        doc = response.json()
        return str(doc.get("error") or doc.get("detail") or response.text)
    except (ValueError, AttributeError):
        return response.text


def _why(response: httpx.Response) -> str:
    return f"the control plane answered {response.status_code}: {_detail(response)[:300]}"


class HttpRegistrySource:
    """DesiredStateSource over the control plane's replica API (registry/replica_api.py)."""

    def __init__(self, url: str, token: str, *, address: str = "",
                 cache_dir: str | os.PathLike | None = None, wait_seconds: float = WAIT_SECONDS,
                 timeout_seconds: float = 10.0, transport: httpx.BaseTransport | None = None):
        if not token:
            raise ValueError("a replica that follows the control plane needs its replica "
                             "credential (MMC_REPLICA_TOKEN or --replica-token-file)")
        self.url = url.rstrip("/")
        self.address = address
        self.cache = Path(cache_dir) if cache_dir else default_cache_dir()
        self.cache.mkdir(parents=True, exist_ok=True)
        self.trt_cache_root = os.environ.get("MMC_TRT_CACHE_DIR") or str(self.cache.parent / "trt")
        self.wait_seconds = wait_seconds
        self.started_at = time.time()
        headers = {"Authorization": f"Bearer {token}", "User-Agent": "mmc-serve"}
        timeout = httpx.Timeout(timeout_seconds, read=wait_seconds + timeout_seconds)

        def client() -> httpx.Client:
            return httpx.Client(base_url=self.url, headers=headers, timeout=timeout,
                                transport=transport, follow_redirects=False)

        self._make_client = client
        self._capture_client: httpx.Client | None = None  # the capture flusher's, made on use
        self._client = client()  # the reconciler's thread: heartbeats, artifacts, first fetch
        self._poll_client = client()  # the long poll's own thread
        self._lock = threading.Lock()
        self._state: DesiredState | None = None
        self._etag = ""
        self._following = False
        self._follow_error: str | None = None
        self._stop = threading.Event()
        self._reported: dict | None = None  # the versions of the last acknowledged heartbeat
        self._reported_at = 0.0
        self._quiet_until = 0.0  # no heartbeat before (a 503's Retry-After)

    # -- desired state -------------------------------------------------------------------------

    def _artifact_path(self, sha256: str) -> str:
        return str(self.cache / sha256)

    def _get_state(self, client: httpx.Client, wait: float) -> bool:
        """One GET of the desired state (conditional; a long poll with `wait`); True when it
        brought a new revision. Raises SourceUnavailable."""
        with self._lock:
            etag = self._etag
        response = self._request("GET", STATE, client=client,
                                 params={"wait": f"{wait:g}"} if wait else None,
                                 headers={"If-None-Match": etag} if etag else None)
        if response.status_code == 304:
            return False
        if response.status_code != 200:
            raise SourceUnavailable(_why(response))
        try:
            state = decode_desired(response.json(), artifact_path=self._artifact_path,
                                   trt_cache_root=self.trt_cache_root)
        except (ValueError, WireError) as exc:
            raise SourceUnavailable(f"the control plane's desired state was not readable: "
                                    f"{exc}") from None
        with self._lock:
            if self._state is None or state.revision >= self._state.revision:
                self._state, self._etag = state, response.headers.get("etag", "")
        return True

    def revision(self) -> int:
        with self._lock:
            following, error, state = self._following, self._follow_error, self._state
        if following and error:
            raise SourceUnavailable(error)
        if not following or state is None:
            self._get_state(self._client, 0)
        with self._lock:
            return self._state.revision  # type: ignore[union-attr]

    def fetch(self) -> DesiredState:
        with self._lock:
            state = self._state
        if state is None:
            self._get_state(self._client, 0)
            with self._lock:
                state = self._state
        return state  # type: ignore[return-value]

    def subscribe(self, callback: Callable[[int], None]) -> None:
        """Hold the long poll on a thread of its own; each new revision wakes the reconciler,
        and so does a failure (it then reports the replica degraded) and a recovery."""
        self._following = True
        threading.Thread(target=self._follow, args=(callback,), name="mmc-follow",
                         daemon=True).start()

    def _follow(self, callback: Callable[[int], None]) -> None:
        delay = 0.2
        while not self._stop.is_set():
            try:
                changed = self._get_state(self._poll_client, self.wait_seconds)
            except SourceUnavailable as exc:
                with self._lock:
                    first = self._follow_error is None
                    self._follow_error = str(exc)
                if first:
                    log.warning("%s", exc)
                    callback(-1)
                self._stop.wait(delay)
                delay = min(delay * 2, 5.0)
                continue
            delay = 0.2
            with self._lock:
                recovered, self._follow_error = self._follow_error is not None, None
                revision = self._state.revision if self._state else -1
            if changed or recovered:
                callback(revision)

    # -- heartbeats ----------------------------------------------------------------------------

    def report(self, observed: ObservedState) -> None:
        """A heartbeat: what changed since the last acknowledged one (`"same": true` when
        nothing did), the whole observed state at least every FULL_HEARTBEAT_EVERY_S."""
        now = time.monotonic()
        if now < self._quiet_until:  # the control plane asked for a pause (503 Retry-After)
            return
        whole = self._reported is None or now - self._reported_at >= FULL_HEARTBEAT_EVERY_S
        response = self._put_heartbeat(observed, None if whole else self._reported)
        if response.status_code == 409 and not whole:  # the control plane holds none: all
            whole = True
            response = self._put_heartbeat(observed, None)
        if response.status_code == 503:
            retry = response.headers.get("retry-after", "")
            self._quiet_until = now + (float(retry) if retry.isdigit() else 5.0)
        if response.status_code != 204:
            raise SourceUnavailable(_why(response))
        self._reported = observed.versions
        if whole:
            self._reported_at = now

    def _put_heartbeat(self, observed: ObservedState, since: dict | None) -> httpx.Response:
        body = {**encode_observed(observed, since=since), "address": self.address,
                "started_at": self.started_at}
        return self._request("PUT", f"/api/v1/replica/heartbeats/{observed.replica}", json=body)

    def _request(self, method: str, path: str, *, client: httpx.Client | None = None,
                 **kwargs) -> httpx.Response:
        """One call of the replica API (on `client`, default the reconciler thread's); no
        answer at all raises SourceUnavailable saying so."""
        try:
            return (client or self._client).request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise SourceUnavailable(f"the control plane at {self.url} did not answer: "
                                    f"{type(exc).__name__}: {exc}") from None

    def store_capture(self, file: CaptureFile) -> None:
        """A capture file to the control plane (POST /api/v1/replica/capture, the Parquet
        bytes as they are), which checks and stores it; on the capture queue's flusher thread,
        with a client of its own."""
        with self._lock:
            client = self._capture_client
            if client is None:
                client = self._capture_client = self._make_client()
        response = self._request("POST", CAPTURE, client=client, content=file.payload,
                                 headers={"Content-Type": "application/vnd.apache.parquet"})
        if response.status_code != 204:
            raise SourceUnavailable(_why(response))

    def leave(self, replica: str) -> None:
        response = self._request("DELETE", f"/api/v1/replica/heartbeats/{replica}")
        if response.status_code != 204:
            raise SourceUnavailable(_why(response))

    def close(self) -> None:
        self._stop.set()

    # -- artifacts -----------------------------------------------------------------------------

    def fetch_artifact(self, spec: VersionSpec) -> None:
        """The version's artifact into this host's cache (kept while its bytes match)."""
        path = Path(spec.artifact_path)
        if path.is_file():
            return  # written only after its sha256 matched
        part = path.with_name(f".{path.name}.{os.getpid()}.part")
        digest = hashlib.sha256()
        try:
            with self._client.stream("GET", f"/api/v1/replica/artifacts/{spec.sha256}") as r:
                if r.status_code == 404:
                    raise LoadFailed(_why_streamed(r))
                if r.status_code != 200:
                    raise SourceUnavailable(_why_streamed(r))
                with open(part, "wb") as f:
                    for chunk in r.iter_bytes(CHUNK):
                        digest.update(chunk)
                        f.write(chunk)
            if digest.hexdigest() != spec.sha256:
                raise LoadFailed(f"the artifact of {spec.model}:{spec.version} came with "
                                 f"sha256 {digest.hexdigest()}, not {spec.sha256}")
            os.replace(part, path)
        finally:
            part.unlink(missing_ok=True)

    # -- v2 repository extension: load/unload as the caller, through the REST API -------------

    def request_load(self, model: str, authorization: str | None = None) -> None:
        user = self._user_client(authorization)
        with user:
            response = user.get(f"/api/v1/models/{model}/versions/",
                                params={"status": "ready", "ordering": "-number"})
            _raise_for(response)
            rows = response.json()
            rows = rows.get("results", rows) if isinstance(rows, dict) else rows
            ready = [row["number"] for row in rows if row.get("status") == "ready"]
            if not ready:
                raise ModelNotFound(f"model {model!r} has no ready version to load")
            _raise_for(user.post(f"/api/v1/models/{model}/endpoint/deploy/",
                                 json={"version": max(ready),
                                       "reason": "repository load request"}))

    def request_unload(self, model: str, authorization: str | None = None) -> None:
        with self._user_client(authorization) as user:
            _raise_for(user.post(f"/api/v1/models/{model}/endpoint/deploy/",
                                 json={"version": None, "reason": "repository unload request"}))

    def authorize_operator(self, authorization: str | None, what: str) -> None:
        """The caller's API token, as the control plane knows it: an engineer's or an admin's
        that may write (the same rule as repository load/unload)."""
        with self._user_client(authorization, what) as user:
            response = user.get("/api/v1/me/")
            _raise_for(response)
            me = response.json()
        if me.get("role") not in ("engineer", "admin"):
            raise Forbidden(f"{what} needs the engineer role")
        if (me.get("token") or {}).get("read_only"):
            raise Forbidden(f"{what} needs an API token that may write, not a read-only one")

    def _user_client(self, authorization: str | None,
                     what: str = "repository load/unload") -> httpx.Client:
        parts = (authorization or "").split()
        if len(parts) != 2 or parts[0].lower() != "bearer":
            raise Unauthorized(f"{what} needs 'Authorization: Bearer <API token>'")
        return httpx.Client(base_url=self.url, timeout=30.0,
                            headers={"Authorization": authorization, "User-Agent": "mmc-serve"})


#: How a control-plane refusal reads on the data plane.
_AS_SERVING = {401: Unauthorized, 403: Forbidden, 404: ModelNotFound, 409: Conflict}


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 300:
        return
    raise _AS_SERVING.get(response.status_code, InvalidInput)(_detail(response)[:500])


def _why_streamed(response: httpx.Response) -> str:
    response.read()
    return _why(response)
