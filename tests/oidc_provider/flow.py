"""Drive a single sign-on as a browser would, with httpx: the console's SSO link, the provider's
login form, its consent form, and back to the console's callback."""

from __future__ import annotations

from html.parser import HTMLParser

import httpx


class _FormFields(HTMLParser):
    """The named inputs of a page's first form (hidden fields, submit buttons)."""

    def __init__(self):
        super().__init__()
        self.fields: dict[str, str] = {}
        self.forms = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "form":
            self.forms += 1
        elif tag == "input" and self.forms == 1 and attrs.get("name"):
            if attrs.get("type") in ("hidden", "submit"):
                self.fields[attrs["name"]] = attrs.get("value") or ""


def form_fields(html: str, *, submits: bool = False) -> dict[str, str]:
    parser = _FormFields()
    parser.feed(html)
    return {k: v for k, v in parser.fields.items() if submits or k != "allow"}


def sign_in(console_url: str, username: str, password: str, *, consent: bool = True,
            next_path: str = "/models/") -> tuple[httpx.Client, httpx.Response]:
    """-> (a client holding both sites' cookies, the last answer: a console page)."""
    client = httpx.Client(follow_redirects=True, timeout=30)
    r = client.get(f"{console_url}/login/sso/", params={"next": next_path})
    if r.url.path == "/accounts/login/":  # the provider's login form
        r = client.post(r.url, data={**form_fields(r.text), "username": username,
                                     "password": password})
    if 'id="authorizationForm"' in r.text:  # the provider asks for consent
        data = form_fields(r.text)
        if consent:
            data["allow"] = "Authorize"
        r = client.post(r.url, data=data)
    return client, r
