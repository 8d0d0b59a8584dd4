"""/api/docs/ in a browser that can reach nothing but the console (127.0.0.1): Swagger UI comes
from the installed drf-spectacular-sidecar package, so the operations are drawn all the same."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from tests.browser.test_console_flow import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_api_docs_list_the_operations_with_the_network_cut_off(live_server, users, page, shot):
    refused: list[str] = []

    def only_loopback(route) -> None:
        host = urlsplit(route.request.url).hostname
        if host in ("127.0.0.1", "localhost"):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort("internetdisconnected")

    page.context.route("**/*", only_loopback)
    login(page, live_server.url, "viewer")
    failed: list[str] = []  # from the docs page on (the login page's favicon may be cut short)
    page.on("requestfailed", lambda r: r.failure == "net::ERR_ABORTED"  # cut by navigation
            or failed.append(f"{r.url} {r.failure}"))
    page.goto(f"{live_server.url}/api/docs/")
    page.wait_for_selector(".opblock", timeout=30_000)
    operations = page.locator(".opblock").count()
    shot(page, "api-docs-offline")
    assert operations > 50, operations  # every route of the API, drawn by Swagger UI
    assert page.locator(".opblock-summary-path", has_text="/api/v1/models/").count() >= 1
    assert refused == [] and failed == [], (refused, failed)  # it asked for nothing outside
