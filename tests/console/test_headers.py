"""Every console page carries a Content-Security-Policy that allows our own static files only
(htmx included: it is served from django-htmx's static files) and no inline script, style or
eval; the pages hold nothing that policy would block. X-Frame-Options and the cookie flags stay."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from registry import services
from registry.audit import Actor

pytestmark = pytest.mark.django_db(transaction=True)

PAGES = ["/models/", "/models/new/", "/models/fraud/", "/models/fraud/versions/",
         "/models/fraud/versions/1/", "/models/fraud/diff/?a=1&b=2",
         "/models/fraud/deployment/", "/models/fraud/deployment/live/",
         "/models/fraud/deployment/charts/", "/jobs/", "/audit/", "/health/"]


class InlineCode(HTMLParser):
    """Collects what a strict CSP blocks: inline scripts, on* handlers, style attributes and
    elements, javascript: URLs, and scripts from elsewhere."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script":
            src = attrs.get("src") or ""
            if not src.startswith("/static/"):
                self.found.append(f"<script> not from our static files: {attrs}")
            self._in_script = True
        if tag == "style":
            self.found.append("<style> element")
        for name, value in attrs.items():
            if name.startswith("on"):
                self.found.append(f"<{tag} {name}=...> handler")
            if name == "style":
                self.found.append(f"<{tag} style={value!r}>")
            if value and value.strip().lower().startswith("javascript:"):
                self.found.append(f"<{tag} {name}={value!r}>")
            if name.startswith("hx-") and value and "js:" in value:
                self.found.append(f"<{tag} {name}={value!r}> needs eval")

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_script and data.strip():
            self.found.append(f"inline script: {data.strip()[:60]!r}")


def policy(response) -> dict[str, list[str]]:
    header = response["Content-Security-Policy"]
    return {d.split()[0]: d.split()[1:] for d in (p.strip() for p in header.split(";")) if d}


@pytest.fixture
def deployed(catalog, users):
    admin = Actor(user=users["admin"], name="admin")
    services.endpoint_deploy(model_name="fraud", version_number=1, actor=admin)
    services.canary_start(model_name="fraud", version_number=2, weight=25, actor=admin,
                          override=True, reason="a page with a two-part split")
    return "fraud"


def test_console_pages_send_a_csp_without_inline_script(page_client, client, deployed):
    admin = page_client("admin")
    responses = {url: admin.get(url) for url in PAGES}
    responses["/login/"] = client.get("/login/")
    for url, r in responses.items():
        assert r.status_code == 200, url
        csp = policy(r)
        assert csp["default-src"] == ["'self'"] and csp["script-src"] == ["'self'"], url
        assert csp["style-src"] == ["'self'"] and csp["frame-ancestors"] == ["'none'"], url
        assert r["X-Frame-Options"] == "DENY", url
        parser = InlineCode()
        parser.feed(r.content.decode())
        assert parser.found == [], (url, parser.found)
    # the traffic split's widths travel as data, set by our own script
    assert 'data-flex="75"' in responses["/models/fraud/deployment/"].content.decode()

    login = client.post("/login/", {"username": "engineer", "password": "engineer-password-1"})
    assert login.status_code == 302
    session = login.cookies["sessionid"]
    assert session["httponly"] and session["samesite"] == "Lax"
