"""The Replicas page: an admin makes a replica credential (shown once, audited), sees the
replicas heard from and revokes a credential; anyone else is refused."""

from __future__ import annotations

import re

import pytest

from registry.models import AuditEvent, ReplicaCredential
from registry.services.replicas import credential_check

pytestmark = pytest.mark.django_db


def test_an_admin_makes_a_credential_shown_once_then_revokes_it(page_client):
    admin = page_client("admin")
    r = admin.post("/replicas/", {"name": "eu-fleet"})
    assert r.status_code == 200 and r["Cache-Control"] == "no-store"
    raw = re.search(r'id="new-credential" class="mono">(mmcr_[^<]+)<', r.content.decode())[1]
    assert credential_check(raw) == "eu-fleet"
    assert "--registry http://testserver" in r.content.decode()
    assert raw not in admin.get("/replicas/").content.decode()  # once
    cred = ReplicaCredential.objects.get(name="eu-fleet")
    assert raw.startswith(f"mmcr_{cred.prefix}_") and cred.digest not in raw
    again = admin.post("/replicas/", {"name": "eu-fleet"})
    assert again.status_code == 400 and "exists" in again.content.decode()

    r = admin.post(f"/replicas/credentials/{cred.prefix}/revoke/", follow=True)
    assert r.status_code == 200 and "revoked" in r.content.decode()
    assert credential_check(raw) is None
    actions = list(AuditEvent.objects.filter(target="eu-fleet").values_list("action", flat=True))
    assert sorted(actions) == ["replica-credential.create", "replica-credential.revoke"]


@pytest.mark.parametrize("role", ["viewer", "engineer"])
def test_only_an_admin_sees_or_makes_replica_credentials(page_client, role):
    client = page_client(role)
    assert client.get("/replicas/").status_code == 403
    assert client.post("/replicas/", {"name": "sneaky"}).status_code == 403
    assert not ReplicaCredential.objects.exists()
    assert page_client(None).get("/replicas/").status_code == 302  # to the sign-in page


def test_a_blank_name_is_refused_with_the_reason(page_client):
    r = page_client("admin").post("/replicas/", {"name": ""})
    assert r.status_code == 400 and "This field is required" in r.content.decode()
