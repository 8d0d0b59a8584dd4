"""Where outbound requests may go: public addresses only, unless the operator's allow-list
(`settings.OUTBOUND_ALLOW`, from MMC_OUTBOUND_ALLOW) names a network or a host.

A URL is checked when a user gives it (`refusal`) and again just before each request
(`destination`), on every address its host resolves to; the request then goes to the address
that was checked, so a name that resolves elsewhere a moment later (DNS rebinding) gains nothing.
Hosts are read with httpx's own URL parser, the one that sends, and numeric IPv4 spellings
(`2130706433`, `0x7f000001`, `0177.0.0.1`, `127.1`, `0`) are read as the C resolver reads them.

Allow-list entries: a network in CIDR form (`10.20.0.0/16`, `::1/128`), a single address, a host
name (`hooks.internal`: that name, whatever it resolves to) or a domain with a leading dot
(`.corp.example`: the domain and every name under it). `0.0.0.0` and `::` are never allowed."""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
from dataclasses import dataclass
from functools import lru_cache

import httpx
from django.conf import settings

log = logging.getLogger(__name__)
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_NUMERIC_V4 = re.compile(r"[0-9a-fx.]+")
_HOST_NAME = re.compile(r"\.?[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*")
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"),)
# Not public whatever this Python's `is_global` says (its tables have moved between versions).
_NEVER_PUBLIC = (ipaddress.ip_network("64:ff9b:1::/48"), ipaddress.ip_network("192.0.0.0/24"),
                 ipaddress.ip_network("100.64.0.0/10"), ipaddress.ip_network("2001::/23"))


class Refused(Exception):
    """The URL may not be contacted; `reason` is safe to show to whoever gave it."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Unresolved(Exception):
    """The host name has no address now (it may later)."""


@dataclass(frozen=True)
class Destination:
    """A checked URL and the one address to connect to."""

    url: httpx.URL
    host: str          # normalised: lower case, no brackets, no trailing dot
    address: Address

    @property
    def pinned_url(self) -> httpx.URL:
        """The same URL with the checked address in place of the host name."""
        return self.url.copy_with(host=str(self.address))

    @property
    def host_header(self) -> str:
        return self.url.netloc.decode("ascii")

    @property
    def sni_hostname(self) -> str | None:
        """The name a TLS certificate is checked against (None when the URL names an IP)."""
        return None if literal(self.host) is not None else self.host


def parse(url: str) -> httpx.URL:
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, UnicodeError) as exc:
        raise Refused("must be an absolute http:// or https:// URL") from exc
    if parsed.scheme not in ("http", "https") or not parsed.raw_host:
        raise Refused("must be an absolute http:// or https:// URL")
    return parsed


def normalise(raw_host: bytes | str) -> str:
    host = raw_host.decode("ascii") if isinstance(raw_host, bytes) else raw_host
    return host.strip("[]").rstrip(".").lower()


def literal(host: str) -> Address | None:
    """The address a host written as an IP stands for, in any spelling the resolver takes."""
    try:
        return _unzoned(ipaddress.ip_address(host))
    except ValueError:
        pass
    if _NUMERIC_V4.fullmatch(host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def _unzoned(ip: Address) -> Address:
    return ipaddress.ip_address(str(ip).split("%")[0]) if getattr(ip, "scope_id", None) else ip


def resolve(host: str, port: int) -> list[Address]:
    """Every address `host` stands for now (an IP host stands for itself)."""
    ip = literal(host)
    if ip is not None:
        return [ip]
    if host == "localhost" or host.endswith(".localhost"):  # RFC 6761: loopback, no lookup
        return [ipaddress.IPv4Address("127.0.0.1"), ipaddress.IPv6Address("::1")]
    if host == "invalid" or host.endswith(".invalid"):  # RFC 6761: never resolves
        raise Unresolved(host)
    try:
        answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise Unresolved(host) from exc
    found = list(dict.fromkeys(_unzoned(ipaddress.ip_address(a[4][0].split("%")[0]))
                               for a in answers))
    if not found:
        raise Unresolved(host)
    return found


def _embedded_v4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """IPv4 addresses an IPv6 one carries (mapped, compatible, 6to4, Teredo, NAT64): each must
    be allowed too, or `[::ffff:127.0.0.1]` would reach loopback."""
    found = [ip.ipv4_mapped, ip.sixtofour, ip.teredo[1] if ip.teredo else None]
    if int(ip) >> 32 == 0 or any(ip in net for net in _NAT64):
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return [v4 for v4 in found if v4 is not None]


def is_public(ip: Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and not all(map(is_public, _embedded_v4(ip))):
        return False
    return (ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_loopback
                                  or ip.is_link_local or ip.is_private or ip.is_unspecified)
            and not any(ip in net for net in _NEVER_PUBLIC if net.version == ip.version))


@lru_cache(maxsize=8)
def _allow_list(entries: tuple[str, ...]) -> tuple[tuple[Network, ...], frozenset[str]]:
    networks, names = [], set()
    for raw in entries:
        entry = raw.strip().lower()
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            continue
        except ValueError:
            pass
        if _HOST_NAME.fullmatch(entry.rstrip(".")):
            names.add(entry.rstrip("."))
        else:
            log.warning("MMC_OUTBOUND_ALLOW entry %r is neither a network nor a host name; "
                        "ignored", raw)
    return tuple(networks), frozenset(names)


def allow_list() -> tuple[tuple[Network, ...], frozenset[str]]:
    return _allow_list(tuple(getattr(settings, "OUTBOUND_ALLOW", None) or ()))


def allowed(ip: Address, host: str) -> bool:
    """May `host`, resolved to `ip`, be contacted?"""
    if ip.is_unspecified:
        return False  # 0.0.0.0 and :: mean "this machine" to connect()
    networks, names = allow_list()
    if host in names or any(n.startswith(".") and (host == n[1:] or host.endswith(n))
                            for n in names):
        return True
    v4 = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    if any(a in net for net in networks for a in (ip, v4) if a is not None
           and a.version == net.version):
        return True
    return is_public(ip)


def _check(parsed: httpx.URL, host: str, addresses: list[Address]) -> None:
    if not all(allowed(ip, host) for ip in addresses):
        raise Refused(f"must point to a public address; {host} is not one (an operator can "
                      f"allow more with MMC_OUTBOUND_ALLOW)")


def destination(url: str) -> Destination:
    """Check `url` now, resolving its host, and name the address to connect to. Raises Refused
    (policy) or Unresolved (no address)."""
    parsed = parse(url)
    host = normalise(parsed.raw_host)
    addresses = resolve(host, parsed.port or (443 if parsed.scheme == "https" else 80))
    _check(parsed, host, addresses)
    return Destination(parsed, host, addresses[0])


def refusal(url: str) -> str | None:
    """Why a user may not give `url`, or None. A name that does not resolve yet is accepted:
    the check before each request still applies."""
    try:
        destination(url)
    except Refused as exc:
        return exc.reason
    except Unresolved:
        return None
    return None
