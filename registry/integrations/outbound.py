"""Signed outbound POSTs: webhook deliveries and job completion callbacks both go through
`post_signed`, so signing, timeouts, the address policy (registry/integrations/addresses.py) and
the way an outcome is reported live in one place.

An outcome names the class of what happened, never what answered: "HTTP 5xx", "HTTP 3xx" (a
redirect is not followed), "refused: <policy>", "no answer (timeout)" or "no answer (connection
failed)" (a closed port and a service that does not speak HTTP look alike). The response body is
never read.

The receiver verifies `X-MMC-Signature` with `hmac.compare_digest(sig, "sha256=" +
hmac.new(secret, body, sha256).hexdigest())`."""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass

import httpx

from registry.integrations import addresses
from serving.core.tracing import client_span

SIGNATURE_HEADER = "X-MMC-Signature"


def sign(secret: str, body: bytes) -> str:
    """The X-MMC-Signature value: sha256=<hex HMAC-SHA256 of the raw body>."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Outcome:
    status_code: int | None  # None: no HTTP answer at all
    error: str               # empty on a 2xx
    duration_ms: float
    refused: bool = False    # the address policy said no; trying again would not help

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300

    @property
    def retryable(self) -> bool:
        """Worth another try: no answer, 408, 429 or a 5xx (a refusal is not)."""
        code = self.status_code
        return not self.refused and (code is None or code >= 500 or code in (408, 429))


def post_signed(url: str, body: bytes, headers: dict, *, secret: str = "",
                timeout: float = 10.0) -> Outcome:
    """One POST of `body`, signed when there is a secret, to the address `url` resolves to now,
    if the address policy allows it; never raises for network trouble."""
    if secret:
        headers = {**headers, SIGNATURE_HEADER: sign(secret, body)}
    started = time.perf_counter()
    code, error, refused = None, "", False
    try:
        dest = addresses.destination(url)
    except addresses.Refused as exc:
        error, refused = f"refused: {exc.reason}", True
    except addresses.Unresolved:
        error = "no answer (connection failed)"
    else:
        headers = dict(headers)  # with the trace's traceparent while the console traces
        with client_span("POST", headers, {"http.request.method": "POST",
                                           "server.address": dest.host_header}):
            code, error = _post(dest, body, headers, timeout)
    return Outcome(code, error, round((time.perf_counter() - started) * 1000, 2), refused)


def _post(dest: addresses.Destination, body: bytes, headers: dict,
          timeout: float) -> tuple[int | None, str]:
    """POST to the checked address itself (Host header and TLS name from the URL); no proxy
    from the environment, no redirects, and only the status line is read."""
    extensions = {"sni_hostname": dest.sni_hostname} if dest.sni_hostname else {}
    try:
        with httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False) as client:
            with client.stream("POST", dest.pinned_url, content=body, extensions=extensions,
                               headers={**headers, "Host": dest.host_header}) as r:
                code = r.status_code
    except httpx.TimeoutException:
        return None, "no answer (timeout)"
    except (httpx.HTTPError, OSError):
        return None, "no answer (connection failed)"
    return code, "" if 200 <= code < 300 else f"HTTP {code // 100}xx"


def backoff(attempt: int, *, base: float, cap: float) -> float:
    """Seconds before retry number `attempt` + 1: base, 2·base, 4·base... capped."""
    return min(base * 2 ** (attempt - 1), cap)
