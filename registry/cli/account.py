"""`mmc login`, `logout`, `whoami`: a person's token, kept in their config folder (config.py).

    mmc login [URL] [-u NAME]    # password prompt; read from stdin when stdin is not a terminal
    mmc whoami                   # user, role, server, token name and expiry
    mmc logout                   # revoke the token on the server, forget it here
"""

from __future__ import annotations

import getpass
import sys

from mmc import Client, MmcError, Unauthorized, config
from mmc.access import client_name
from mmc.config import Credentials
from registry.cli.output import CliError


def _ask(prompt: str) -> str:
    if sys.stdin.isatty():
        return input(prompt).strip()
    line = sys.stdin.readline()
    if not line:
        raise CliError(f"{prompt.strip(': ').lower()} needed: nothing more on stdin")
    return line.strip()


def _password() -> str:
    if sys.stdin.isatty():
        return getpass.getpass("Password: ")
    line = sys.stdin.readline()  # a pipeline or a script: `printf '%s\n' "$PW" | mmc login`
    if not line:
        raise CliError("password needed: nothing on stdin")
    return line.rstrip("\r\n")


def _expiry(token: dict) -> str:
    return f"expires {token['expiry']}" if token.get("expiry") else "never expires"


def cmd_login(creds: Credentials, a) -> int:
    url = a.url or creds.explicit_url or creds.saved.get("url")
    if not url:
        if not sys.stdin.isatty():
            raise CliError("which server? mmc login URL (or set MMC_URL)")
        url = input(f"Console URL [{config.DEFAULT_URL}]: ").strip() or config.DEFAULT_URL
    url = url.rstrip("/")
    username = a.username or _ask("Username: ")
    password = _password()
    # No token goes with a login (Client.login sends none): the password is the credential,
    # and a token configured for another server must not reach this one.
    with Client(url) as client:
        answer = client.login(username, password, client=client_name("mmc-cli"))
    old = creds.saved
    path = config.save({"url": url, "token": answer.token, "token_key": answer.token_key,
                        "name": answer.name, "username": answer.user, "expiry": answer.expiry})
    if old and old["token"] != answer.token:
        try:  # the login this one replaces (revoked on its own server): kept nowhere now
            with Client(old["url"], old["token"]) as replaced:
                replaced.logout()
        except MmcError:
            pass  # expired or already revoked
    print(f"logged in to {url} as {answer.user} (token {answer.name}, {_expiry(answer.raw)}); "
          f"saved to {path}", file=sys.stderr)
    if creds.token_from in ("MMC_TOKEN", "--token"):
        print(f"note: {creds.token_from} is set and is used before the saved token",
              file=sys.stderr)
    return 0


def cmd_logout(creds: Credentials, a) -> int:
    if not creds.token:
        raise CliError(f"not logged in to {creds.url} (no saved token, no MMC_TOKEN)")
    try:
        with Client(creds.url, creds.token) as client:
            client.logout()
        print(f"revoked the token on {creds.url}", file=sys.stderr)
    except Unauthorized as exc:
        print(f"the server no longer accepts this token ({exc})", file=sys.stderr)
    if creds.token_from == "config":
        print(f"removed {config.remove()}", file=sys.stderr)
    return 0


def cmd_whoami(creds: Credentials, a) -> int:
    if not creds.token:
        raise CliError(f"not logged in to {creds.url}: mmc login (or set MMC_TOKEN)")
    with Client(creds.url, creds.token) as client:
        me = client.whoami().raw
    token = me.get("token") or {}
    where = (f"saved in {config.config_path()}" if creds.token_from == "config"
             else f"from {creds.token_from}")
    teams = ", ".join(f"{t['team']} ({t['role']})" for t in me.get("teams") or []) or "(none)"
    print(f"user:  {me['username']}\nrole:  {me['role'] or '(none)'}\nteams: {teams}\n"
          f"url:   {creds.url}\ntoken: {token.get('name', '?')} ({_expiry(token)}), {where}")
    return 0


def account_parsers(sub) -> None:
    s = sub.add_parser("login", help="log in with a password; saves a token for this machine")
    s.add_argument("url", nargs="?", help=f"the console (default: MMC_URL, the saved one, or a "
                                          f"prompt; e.g. {config.DEFAULT_URL})")
    s.add_argument("-u", "--username", help="default: asked")
    s.set_defaults(fn=cmd_login, account=True)
    s = sub.add_parser("logout", help="revoke the token on the server and forget it here")
    s.set_defaults(fn=cmd_logout, account=True)
    s = sub.add_parser("whoami", help="user, role, server and token in use")
    s.set_defaults(fn=cmd_whoami, account=True)
