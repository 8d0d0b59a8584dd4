"""The deployment page on protection: the revoke dialog of the last key says every call will be
refused, the page says so after, and opening or protecting the endpoint is a button of its own
(engineer and admin), audited."""

from __future__ import annotations

import html as htmllib

import pytest

from registry import services
from registry.audit import Actor
from registry.models import AuditEvent, Endpoint

pytestmark = pytest.mark.django_db(transaction=True)

PAGE = "/models/fraud/deployment/"


@pytest.fixture
def deployed(catalog):
    services.endpoint_deploy(model_name="fraud", version_number=1, actor=Actor.system("test"))
    return "fraud"


def page(client) -> str:
    return htmllib.unescape(client.get(PAGE).content.decode())


def test_revoking_the_last_key_is_announced_before_and_after(page_client, deployed):
    client = page_client("engineer")
    client.post(f"{PAGE}keys/", {"name": "checkout"})
    client.post(f"{PAGE}keys/", {"name": "batch"})
    first, last = Endpoint.objects.get(model__name="fraud").api_keys.order_by("id")
    html = page(client)
    assert "It is the last key" not in html  # two keys: revoking one leaves the other working
    client.post(f"{PAGE}keys/{first.prefix}/revoke/")
    html = page(client)
    assert ("Revoke predict key batch" in html and "It is the last key: the endpoint stays "
            "protected, so every call is refused (401)" in html)
    r = client.post(f"{PAGE}keys/{last.prefix}/revoke/", follow=True)
    html = htmllib.unescape(r.content.decode())
    assert "it was the endpoint's last key" in html and "every call is refused" in html
    assert "Protected, no keys: every call is refused" in html
    assert "protected, no keys" in html and 'id="open-endpoint"' in html


def test_opening_and_protecting_are_buttons_of_their_own_and_audited(page_client, deployed):
    client = page_client("engineer")
    html = page(client)
    assert 'id="protect-endpoint"' in html and 'id="open-endpoint"' not in html
    r = client.post(f"{PAGE}protect/", follow=True)
    html = htmllib.unescape(r.content.decode())
    assert "fraud is protected" in html and "Protected, no keys: every call is refused" in html
    assert Endpoint.objects.get(model__name="fraud").protected
    r = client.post(f"{PAGE}open/", follow=True)
    html = htmllib.unescape(r.content.decode())
    assert "fraud is open" in html and 'id="protect-endpoint"' in html
    assert not Endpoint.objects.get(model__name="fraud").protected
    assert [(e.action, e.actor_name) for e in AuditEvent.objects.filter(
        action__in=("endpoint.protect", "endpoint.open")).order_by("id")] == [
        ("endpoint.protect", "engineer"), ("endpoint.open", "engineer")]
    audit = htmllib.unescape(page_client("admin").get("/audit/").content.decode())
    assert "engineer removed the predict key requirement from fraud" in audit


def test_a_viewer_can_neither_open_nor_protect(page_client, deployed):
    services.endpoint_protect(model_name="fraud", actor=Actor.system("test"))
    viewer = page_client("viewer")
    assert 'id="open-endpoint"' not in page(viewer)
    assert viewer.post(f"{PAGE}open/").status_code == 403
    assert Endpoint.objects.get(model__name="fraud").protected
