"""The `mmc` CLI keeps its credentials where they belong: the global --url/--token (or MMC_URL,
MMC_TOKEN) name the server the token goes to, and no sub-command argument can replace them."""

from __future__ import annotations

import argparse
import http.server
import threading

import pytest

from registry.cli.main import GLOBAL_TOKEN, GLOBAL_URL, parser


def subcommands(p: argparse.ArgumentParser, prefix: str = ""):
    """(name, parser) of every sub-command, nested ones included (`batch run`)."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prefix}{name}", sub
                yield from subcommands(sub, f"{prefix}{name} ")


SUBCOMMANDS = dict(subcommands(parser()))


def test_every_sub_command_is_checked():
    assert {"webhook-add", "upload", "deploy", "canary", "batch run"} <= set(SUBCOMMANDS)


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_no_sub_command_argument_can_replace_the_server_or_the_token(name):
    dests = {a.dest for a in SUBCOMMANDS[name]._actions}
    assert not dests & {GLOBAL_URL, GLOBAL_TOKEN}


class _Receiver(http.server.BaseHTTPRequestHandler):
    seen: list[dict] = []

    def do_POST(self):  # noqa: N802 - http.server's naming
        self.seen.append(dict(self.headers))
        self.send_response(204)
        self.end_headers()

    do_GET = do_POST  # noqa: N815

    def log_message(self, *args):
        pass


def test_webhook_add_subscribes_the_url_and_never_sends_the_token_to_it(live_server, admin):
    from registry.audit import Actor
    from registry.cli import main as mmc
    from registry.models import WebhookSubscription
    from registry.services import token_create

    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    hook = f"http://127.0.0.1:{receiver.server_port}/hook"
    _, token = token_create(username="admin", name="cli", actor=Actor.system("test"))
    try:
        assert mmc(["--url", live_server.url, "--token", token, "webhook-add", hook]) == 0
    finally:
        receiver.shutdown()
    assert WebhookSubscription.objects.filter(url=hook).exists()
    assert not any("Authorization" in h or "authorization" in h for h in _Receiver.seen)
