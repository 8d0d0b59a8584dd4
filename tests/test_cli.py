"""The `mmc` CLI keeps its credentials where they belong: every sub-command, found by walking the
parser (a new one is covered without editing this file), sends its requests to the configured
server only, with the configured token, and a URL given to a sub-command (webhook-add URL,
--callback-url) never receives a request with a token. The saved login is found after the flags
and the environment, and its token only goes to the server that issued it."""

from __future__ import annotations

import argparse
import http.server
import io
import json
import stat
import threading
import uuid

import httpx
import pytest

from registry.cli import config
from registry.cli.main import main, parser

TOKEN = "mmc_configured-token"
JOB_ID = str(uuid.uuid4())
# One answer for every path: enough of a version, a job, a list, an endpoint, a delivery and a
# token for each command to carry on to its next request and finish.
ANSWER = {"results": [], "id": JOB_ID, "number": 1, "sha256": "0" * 64, "status": "succeeded",
          "progress": {"rows_done": 0, "rows_total": 0}, "convergence": None,
          "validation_report": {}, "username": "someone", "role": "engineer",
          "token": {"name": "mmc-cli@test", "expiry": None}}
LOGIN_ANSWER = {"token": "mmc_minted-by-login", "token_key": "mmc_minted", "name": "mmc-cli@x",
                "user": "someone", "expiry": None, "created": None}


def subcommands(p: argparse.ArgumentParser, prefix: str = ""):
    """(name, parser) of every runnable sub-command, nested ones included (`batch run`)."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = any(isinstance(a, argparse._SubParsersAction) for a in sub._actions)
                if nested:
                    yield from subcommands(sub, f"{prefix}{name} ")
                else:
                    yield f"{prefix}{name}", sub


SUBCOMMANDS = dict(subcommands(parser()))


class Recorder:
    """A real HTTP server on 127.0.0.1 that records method, path and headers of each request."""

    def __init__(self):
        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                elif self.headers.get("Transfer-Encoding") == "chunked":
                    while (size := int(self.rfile.readline().split(b";")[0], 16)):
                        self.rfile.read(size + 2)
                    self.rfile.readline()
                seen.append({"method": self.command, "path": self.path,
                             "headers": {k.lower(): v for k, v in self.headers.items()}})
                body = json.dumps(LOGIN_ANSWER if self.path.endswith("/tokens/login/")
                                  else ANSWER).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer  # noqa: N815

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def servers():
    configured, other = Recorder(), Recorder()
    yield configured, other
    configured.close()
    other.close()


@pytest.fixture
def sent(monkeypatch):
    """Every request the CLI's HTTP client sends, to any address."""
    requests = []
    original = httpx.HTTPTransport.handle_request

    def record(self, request):
        requests.append(request)
        return original(self, request)

    monkeypatch.setattr(httpx.HTTPTransport, "handle_request", record)
    return requests


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for name in ("MMC_URL", "MMC_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def arguments(sub: argparse.ArgumentParser, tmp_path, other_url: str, every_option: bool):
    """A valid command line for `sub`: its positionals (and with every_option, each option and
    flag too), each argument given a value by its kind; anything named like a URL points at the
    other server."""
    (tmp_path / "in.bin").write_bytes(b"\x00" * 16)

    def value(action) -> str:
        dest = action.dest
        if action.choices:
            return str(next(iter(action.choices)))
        if "url" in dest:
            return f"{other_url}/hook"
        if action.type in (int, float):
            return "1"
        if dest == "spec":  # a pipeline spec: JSON (the server checks what it says)
            (tmp_path / "spec.json").write_text("{}")
            return str(tmp_path / "spec.json")
        if dest in ("file", "dataset"):
            return str(tmp_path / "in.bin")
        if dest in ("output", "out", "result"):
            return str(tmp_path / f"{dest}.out")
        if dest == "plan" or (dest == "metadata" and sub.prog.endswith(" upload")):
            return "{}"
        if dest == "metadata":
            return "team:ml"
        if dest == "metric":
            return "auc=0.9" if sub.prog.endswith(" upload") else "auc>0.9"
        if dest == "id":
            return JOB_ID
        return "x"

    argv = []
    for action in sub._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if not action.option_strings:
            argv.append(value(action))
        elif every_option or action.required:
            argv.append(action.option_strings[-1])
            if action.nargs != 0:
                argv.append(value(action))
    return argv


def test_every_sub_command_is_found():
    assert {"login", "logout", "whoami", "webhook-add", "upload", "deploy", "canary",
            "batch run", "batch upload", "async-infer"} <= set(SUBCOMMANDS)


@pytest.mark.parametrize("every_option", [False, True], ids=["required", "every-option"])
@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_each_sub_command_talks_only_to_the_configured_server_with_its_token(
        name, every_option, servers, sent, home, monkeypatch):
    configured, other = servers
    monkeypatch.setenv("MMC_URL", configured.url)
    monkeypatch.setenv("MMC_TOKEN", TOKEN)
    monkeypatch.setattr("sys.stdin", io.StringIO("someone\na-password\n"))  # mmc login
    argv = [*name.split(), *arguments(SUBCOMMANDS[name], home, other.url, every_option)]

    assert main(argv) == 0, argv

    assert sent, f"{argv}: no request"
    if name == "login":  # its URL argument is the server; it sends a password, never a token
        target = other if argv[1].startswith(other.url) else configured
        assert {str(r.url.copy_with(path="/")) for r in sent} == {target.url + "/"}
        assert all("authorization" not in r.headers for r in sent)
        assert [(r["method"], r["path"].endswith("/api/v1/tokens/login/"))
                for r in target.seen] == [("POST", True)]
        return
    for request in sent:
        assert (request.url.host, request.url.port) == ("127.0.0.1", configured.server.server_port)
        assert request.headers["authorization"] == f"Bearer {TOKEN}"
    assert len(configured.seen) == len(sent)
    assert all(r["headers"].get("authorization") == f"Bearer {TOKEN}" for r in configured.seen)
    assert other.seen == []  # a URL given to the command is the server's to call, not ours


def test_a_sub_command_argument_named_like_a_global_option_stays_the_sub_command_s():
    args = parser().parse_args(["--url", "http://console", "--token", "t",
                                "webhook-add", "http://hooks.example/x"])
    assert (args.url, args.token) == ("http://console", "t")
    assert args.command.url == "http://hooks.example/x"
    assert set(vars(args)) == {"url", "token", "command"}
    with pytest.raises(SystemExit):  # a global option after the sub-command is refused
        parser().parse_args(["webhook-add", "http://hooks.example/x", "--token", "t"])


def _save(url: str, token: str = "mmc_saved"):
    config.save({"url": url, "token": token, "token_key": "mmc_saved", "name": "mmc-cli@x",
                 "username": "someone", "expiry": None})


def test_flags_beat_the_environment_which_beats_the_saved_login(home, monkeypatch):
    _save("http://saved:8000")
    c = config.resolve(url=None, token=None)
    assert (c.url, c.token, c.url_from, c.token_from) == (
        "http://saved:8000", "mmc_saved", "config", "config")
    monkeypatch.setenv("MMC_URL", "http://env:8000")
    monkeypatch.setenv("MMC_TOKEN", "mmc_env")
    c = config.resolve(url=None, token=None)
    assert (c.url, c.token) == ("http://env:8000", "mmc_env")
    c = config.resolve(url="http://flag:8000", token="mmc_flag")
    assert (c.url, c.token) == ("http://flag:8000", "mmc_flag")


def test_the_saved_token_never_goes_to_another_server(home, monkeypatch):
    _save("http://saved:8000")
    monkeypatch.setenv("MMC_URL", "http://elsewhere:8000")
    assert config.resolve(url=None, token=None).token is None
    assert config.resolve(url="http://other:1", token=None).token is None
    assert config.resolve(url="http://saved:8000/", token=None).token == "mmc_saved"


def test_the_config_file_is_private(home):
    _save("http://saved:8000")
    path = home / "xdg" / "mmc" / "config.json"
    assert config.config_path() == path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert config.remove() == path and not path.exists()


def test_without_xdg_config_home_the_file_is_under_home(home, monkeypatch):
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert config.config_path() == home / ".config" / "mmc" / "config.json"


def test_login_without_a_url_goes_to_mmc_url_and_never_carries_the_configured_token(
        servers, sent, home, monkeypatch, capsys):
    configured, _ = servers
    monkeypatch.setenv("MMC_URL", configured.url)
    monkeypatch.setenv("MMC_TOKEN", TOKEN)
    monkeypatch.setattr("sys.stdin", io.StringIO("someone\na-password\n"))
    assert main(["login"]) == 0
    assert [(r.method, r.url.path, "authorization" in r.headers) for r in sent] == [
        ("POST", "/api/v1/tokens/login/", False)]
    assert configured.seen[0]["path"] == "/api/v1/tokens/login/"
    saved = config.load()
    assert (saved["url"], saved["token"]) == (configured.url, LOGIN_ANSWER["token"])
    assert "MMC_TOKEN is set" in capsys.readouterr().err


def test_the_saved_login_is_used_then_revoked_and_forgotten(servers, sent, home):
    configured, other = servers
    _save(configured.url)
    assert main(["whoami"]) == 0
    assert main(["logout"]) == 0
    assert [(r["method"], r["path"], r["headers"]["authorization"]) for r in configured.seen] == [
        ("GET", "/api/v1/me/", "Bearer mmc_saved"),
        ("POST", "/api/v1/tokens/logout/", "Bearer mmc_saved")]
    assert config.load() == {} and not config.config_path().exists()
    assert main(["whoami"]) == 1  # nothing left to send
    assert len(configured.seen) == 2 and other.seen == []
