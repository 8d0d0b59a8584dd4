"""The models list stays a constant number of queries however many rows a page shows."""

from __future__ import annotations

import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from registry.models import ModelVersion

from .conftest import MODELS, VERSIONS


@pytest.mark.django_db
def test_model_list_query_count_does_not_grow_with_page_size(client, big_catalog):
    client.force_login(big_catalog)
    counts, timings = {}, {}
    for size in (25, 50, 100):
        for htmx in (False, True):
            headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}
            started = time.perf_counter()
            with CaptureQueriesContext(connection) as ctx:
                r = client.get(f"/models/?per_page={size}&page=2", **headers)
            timings[(size, htmx)] = time.perf_counter() - started
            assert r.status_code == 200
            html = r.content.decode()
            assert html.count("/models/model-") >= size  # the rows really are there
            assert "v20" in html and "validating" in html and "v2 at 10%" in html
            counts[(size, htmx)] = len(ctx.captured_queries)
    print("\nqueries per request:", counts)
    print("seconds per request:", {k: round(v, 3) for k, v in timings.items()})
    full = {counts[(s, False)] for s in (25, 50, 100)}
    partial = {counts[(s, True)] for s in (25, 50, 100)}
    assert len(full) == 1 and len(partial) == 1, counts
    assert max(full | partial) <= 13, counts  # 12 before teams; +1: the team picker
    assert ModelVersion.objects.count() == MODELS * VERSIONS


@pytest.mark.django_db
def test_model_list_filters_stay_flat_too(client, big_catalog, django_assert_max_num_queries):
    client.force_login(big_catalog)
    with django_assert_max_num_queries(13):
        r = client.get("/models/?tag=team:3&search=model-0&per_page=100",
                       HTTP_HX_REQUEST="true")
    assert r.status_code == 200 and "model-0003" in r.content.decode()
