"""Where a serving replica is reached: the URL it advertises in its heartbeat (a load test, run
by a job in another thread or process, sends its requests there).

MMC_REPLICA_ADDRESS may be a URL or what an orchestrator hands out: a bare host, host:port or
IP (Kubernetes' downward API gives `status.podIP`, with neither scheme nor port). A replica
completes it with http:// and the port it listens on; unset, it names the host it listens on
(the machine's name when that is every interface). Pure: no Django, no sockets opened."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

#: What a replica advertised before it knew its URL (the embedded server's old default).
NO_URL = ("", "embedded")
WILDCARDS = ("", "0.0.0.0", "::", "[::]")


def replica_url(address: str, *, port: int | None = None) -> str:
    """The http(s) URL `address` names ("" when it names none): a URL as it is; a bare host,
    host:port or IP with http:// and, when it has no port, `port`."""
    address = (address or "").strip()
    bare = "://" not in address
    if bare and address.count(":") > 1 and not address.startswith("["):  # a bare IPv6 address
        address = f"[{address}]"
    url = f"http://{address}" if bare else address
    try:
        parts = urlsplit(url)
        given = parts.port
    except ValueError:  # a port that is not a number
        return ""
    if (address in NO_URL or parts.scheme not in ("http", "https") or not parts.hostname
            or parts.netloc.endswith(":")):
        return ""
    url = url.rstrip("/")
    return f"{url}:{port}" if bare and given is None and port else url


def advertised_url(configured: str, *, host: str, port: int, wildcard_host: str = "") -> str:
    """What a replica listening on host:port advertises: MMC_REPLICA_ADDRESS (`configured`)
    completed by replica_url, else that host (for every interface: `wildcard_host`, default
    the machine's name, as compose's DNS and most LANs resolve it)."""
    if configured.strip():
        return replica_url(configured, port=port)
    if host in WILDCARDS:
        host = wildcard_host or socket.gethostname()
    return replica_url(host, port=port)
