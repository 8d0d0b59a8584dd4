"""The audit export is safe to open in a spreadsheet: a cell that would start a formula is
written as text (OWASP "CSV injection"), whatever field it is in."""

from __future__ import annotations

import csv
import io

import pytest
from django.db import transaction

from registry.audit import Actor, record

pytestmark = pytest.mark.django_db(transaction=True)

PAYLOADS = ["=cmd|' /C calc'!A0", "+1+1", "-2+3", "@SUM(A1:A9)", "\t=1+1", "\r=1+1"]


def test_audit_csv_neutralises_formula_cells(page_client):
    with transaction.atomic():
        for payload in PAYLOADS:
            record(Actor.system(payload), "test.csv", target_type="test", target=payload,
                   model_name=payload, reason=payload)
        record(Actor.system("ci"), "test.csv", target_type="test", target="plain",
               reason="a plain reason, = inside is fine")

    r = page_client("admin").get("/audit/export.csv?action=test.")
    rows = list(csv.DictReader(io.StringIO(b"".join(r.streaming_content).decode())))
    assert len(rows) == len(PAYLOADS) + 1
    for row in rows:
        for field, cell in row.items():
            assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), (field, cell)
    by_reason = {row["reason"]: row for row in rows}
    for payload in PAYLOADS:  # the text is kept, behind a quote
        row = by_reason["'" + payload]
        assert row["actor_name"] == row["target"] == row["model_name"] == "'" + payload
    assert "a plain reason, = inside is fine" in by_reason
