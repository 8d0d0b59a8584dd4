"""Where a client finds its server and token, the same for `mmc.Client()` and the `mmc` CLI:
the arguments (the CLI's --url/--token), else MMC_URL/MMC_TOKEN, else the file `mmc login` wrote
($XDG_CONFIG_HOME/mmc/config.json or ~/.config/mmc/config.json, mode 0600 in a 0700 folder). The
saved token is only ever sent to the server it was issued by: a URL from an argument or the
environment that names another server gets no token from the file."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8000"  # `make start`


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "mmc" / "config.json"


def same_server(a: str, b: str) -> bool:
    return a.rstrip("/").lower() == b.rstrip("/").lower()


def load() -> dict:
    """The saved login, or {} when there is none (or it cannot be read as one)."""
    try:
        data = json.loads(config_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("url") and data.get("token") else {}


def save(data: dict) -> Path:
    """Write the login atomically; the token is never readable by anyone else, even briefly."""
    path = config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def remove() -> Path | None:
    path = config_path()
    try:
        path.unlink()
    except FileNotFoundError:
        return None
    return path


@dataclass(frozen=True)
class Credentials:
    url: str
    token: str | None
    url_from: str  # "--url" (an argument), "MMC_URL", "config", "default"
    token_from: str | None  # "--token" (an argument), "MMC_TOKEN", "config", or None
    saved: dict  # the config file's login ({} if none)

    @property
    def explicit_url(self) -> str | None:
        """The URL the caller named (argument or environment), not one read from the file."""
        return self.url if self.url_from in ("--url", "MMC_URL") else None


def resolve(*, url: str | None, token: str | None,
            environ: Mapping[str, str] = os.environ) -> Credentials:
    """Arguments > MMC_URL/MMC_TOKEN > the saved login, each item on its own; the saved token
    only goes with the saved URL."""
    saved = load()
    if url:
        chosen, url_from = url, "--url"
    elif environ.get("MMC_URL"):
        chosen, url_from = environ["MMC_URL"], "MMC_URL"
    elif saved:
        chosen, url_from = saved["url"], "config"
    else:
        chosen, url_from = DEFAULT_URL, "default"
    if token:
        secret, token_from = token, "--token"
    elif environ.get("MMC_TOKEN"):
        secret, token_from = environ["MMC_TOKEN"], "MMC_TOKEN"
    elif saved and same_server(saved["url"], chosen):
        secret, token_from = saved["token"], "config"
    else:
        secret, token_from = None, None
    return Credentials(url=chosen.rstrip("/"), token=secret, url_from=url_from,
                       token_from=token_from, saved=saved)
