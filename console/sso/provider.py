"""The OpenID provider as its discovery document describes it. The document is fetched once per
process, on first use, and kept; the signing keys (JWKS) likewise, fetched again only when an ID
token names a key not seen yet (the provider rotated its keys). A failed fetch is not kept."""

from __future__ import annotations

import threading

import httpx
import jwt
from django.conf import settings

SIGNING_ALGORITHM = "RS256"
REQUIRED = ("issuer", "authorization_endpoint", "token_endpoint", "jwks_uri")

_lock = threading.Lock()
_documents: dict[str, dict] = {}  # issuer -> discovery document
_keys: dict[str, list[dict]] = {}  # jwks_uri -> its keys


class ProviderUnavailable(Exception):
    """The provider could not be reached, or what it answered cannot be used."""


def discovery_url(issuer: str) -> str:
    return issuer.rstrip("/") + "/.well-known/openid-configuration"


def _get_json(url: str) -> dict:
    try:
        response = httpx.get(url, timeout=settings.OIDC_TIMEOUT, follow_redirects=False)
        response.raise_for_status()
        return response.json()
    except httpx.HTTPStatusError as exc:
        raise ProviderUnavailable(f"{url} answered HTTP {exc.response.status_code}") from exc
    except httpx.HTTPError as exc:
        raise ProviderUnavailable(f"{url} could not be reached ({type(exc).__name__})") from exc
    except ValueError as exc:
        raise ProviderUnavailable(f"{url} did not answer JSON") from exc


def _fetch_document(issuer: str) -> dict:
    document = _get_json(discovery_url(issuer))
    missing = [key for key in REQUIRED if not document.get(key)]
    if missing:
        raise ProviderUnavailable(f"the discovery document lacks {', '.join(missing)}")
    # OpenID Connect Discovery 4.3: the document must name the issuer it was fetched for.
    if document["issuer"].rstrip("/") != issuer.rstrip("/"):
        raise ProviderUnavailable(f"the discovery document names issuer {document['issuer']!r}, "
                                  f"not the configured {issuer!r}")
    algorithms = document.get("id_token_signing_alg_values_supported") or [SIGNING_ALGORITHM]
    if SIGNING_ALGORITHM not in algorithms:
        raise ProviderUnavailable(f"the provider does not sign ID tokens with {SIGNING_ALGORITHM}")
    return document


def metadata() -> dict:
    """The configured issuer's discovery document (endpoints, jwks_uri, issuer)."""
    issuer = settings.OIDC_ISSUER
    with _lock:
        if issuer not in _documents:
            _documents[issuer] = _fetch_document(issuer)
        return _documents[issuer]


def signing_key(token: str) -> jwt.PyJWK:
    """The provider's public key that signed `token` (by its header's kid)."""
    header = jwt.get_unverified_header(token)
    uri = metadata()["jwks_uri"]
    with _lock:
        for attempt in range(2):
            if attempt or uri not in _keys:
                _keys[uri] = _get_json(uri).get("keys", [])
            keys = [k for k in _keys[uri] if k.get("kty") == "RSA" and k.get("use", "sig") == "sig"
                    and k.get("alg", SIGNING_ALGORITHM) == SIGNING_ALGORITHM]
            if header.get("kid") is not None:
                keys = [k for k in keys if k.get("kid") == header["kid"]]
            if len(keys) == 1:
                return jwt.PyJWK(keys[0], algorithm=SIGNING_ALGORITHM)
    raise jwt.InvalidKeyError(f"the provider's JWKS has no single RSA key for kid "
                              f"{header.get('kid')!r}")


def forget() -> None:
    """Drop what was fetched (the next sign-in fetches it again)."""
    with _lock:
        _documents.clear()
        _keys.clear()
