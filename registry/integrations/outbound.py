"""Signed outbound POSTs: webhook deliveries and job completion callbacks both go through
`post_signed`, so signing, timeouts and the way an outcome is reported live in one place.

The receiver verifies `X-MMC-Signature` with `hmac.compare_digest(sig, "sha256=" +
hmac.new(secret, body, sha256).hexdigest())`."""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass

import httpx

SIGNATURE_HEADER = "X-MMC-Signature"


def sign(secret: str, body: bytes) -> str:
    """The X-MMC-Signature value: sha256=<hex HMAC-SHA256 of the raw body>."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Outcome:
    status_code: int | None  # None: no HTTP answer at all
    error: str               # empty on a 2xx
    duration_ms: float

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300

    @property
    def retryable(self) -> bool:
        """Worth another try: no answer, 408, 429 or a 5xx."""
        code = self.status_code
        return code is None or code >= 500 or code in (408, 429)


def post_signed(url: str, body: bytes, headers: dict, *, secret: str = "",
                timeout: float = 10.0) -> Outcome:
    """One POST of `body`, signed when there is a secret; never raises for network trouble."""
    if secret:
        headers = {**headers, SIGNATURE_HEADER: sign(secret, body)}
    started = time.perf_counter()
    try:
        r = httpx.post(url, content=body, headers=headers, timeout=timeout)
        code = r.status_code
        error = "" if r.is_success else f"HTTP {code}: {r.text[:200]}"
    except httpx.HTTPError as exc:
        code, error = None, f"{exc.__class__.__name__}: {exc}"[:500]
    return Outcome(code, error, round((time.perf_counter() - started) * 1000, 2))


def backoff(attempt: int, *, base: float, cap: float) -> float:
    """Seconds before retry number `attempt` + 1: base, 2·base, 4·base... capped."""
    return min(base * 2 ** (attempt - 1), cap)
