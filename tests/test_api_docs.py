"""/api/docs/ works on a machine without internet: Swagger UI comes from our own static files
(the drf-spectacular-sidecar package), and the page's CSP names no other origin."""

from __future__ import annotations

import re

import pytest


@pytest.mark.django_db
def test_the_api_docs_load_swagger_ui_from_our_own_static_files(engineer, client):
    page = engineer.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    scripts = [a for a in assets if a.endswith(".js")]
    assert scripts and all(a.startswith("/") and not a.startswith("//") for a in assets), assets
    assert any("swagger-ui-bundle" in a for a in scripts), scripts
    bundle = next(a for a in scripts if "swagger-ui-bundle" in a)
    served = client.get(bundle)
    assert served.status_code == 200
    csp = page.headers["Content-Security-Policy"]
    assert "http://" not in csp and "https://" not in csp, csp
