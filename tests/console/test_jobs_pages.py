"""Jobs pages and the version page's TensorRT section: real batch transforms run by the real
worker (in-process or Celery), followed, cancelled and downloaded from the console; the roles the
API enforces apply here too."""

from __future__ import annotations

import re

import numpy as np
import pytest

from registry import samples
from registry.models import AuditEvent
from tests.test_jobs import npy_bytes, upload_dataset, wait_job

pytestmark = pytest.mark.django_db(transaction=True)
ROWS = 100_000


@pytest.fixture
def mlp(ready_model):
    return ready_model("mlp", samples.mlp())


def start_batch(engineer, mlp, rows: int, **params) -> str:
    x = np.random.default_rng(1).standard_normal((rows, 64)).astype(np.float32)
    ds = upload_dataset(engineer, npy_bytes(x), "rows.npy")
    r = engineer.post("/api/v1/models/mlp/batch/",
                      {"dataset": ds["id"], "version": mlp["number"], **params}, format="json")
    assert r.status_code == 202, r.content
    return r.json()["id"]


@pytest.mark.parametrize("url", ["/jobs/", "/jobs/00000000-0000-0000-0000-000000000000/"])
def test_jobs_pages_need_the_engineer_role_like_the_api(page_client, users, url):
    assert page_client(None).get(url).status_code == 302
    assert page_client("viewer").get(url).status_code == 403
    nav = page_client("viewer").get("/models/").content.decode()
    assert 'href="/jobs/"' not in nav
    assert 'href="/jobs/"' in page_client("engineer").get("/models/").content.decode()


def test_a_finished_batch_shows_its_rows_rate_and_a_working_download(page_client, engineer,
                                                                      mlp):
    job_id = start_batch(engineer, mlp, 3000, chunk_rows=1000)
    done = wait_job(engineer, job_id)
    assert done["status"] == "succeeded", done["failure_reason"]
    client = page_client("engineer")
    html = client.get("/jobs/").content.decode()
    row = re.search(rf'<tr data-job="{job_id}" data-status="succeeded">(.*?)</tr>', html, re.S)
    assert row, html
    assert '<progress max="3000" value="3000"' in row[1] and "3000 / 3000 rows (100 %)" in row[1]
    assert f'href="/api/v1/jobs/{job_id}/result/"' in row[1]
    assert "hx-trigger" not in html.split('id="job-table"')[1].split(">")[0]  # nothing to poll
    detail = client.get(f"/jobs/{job_id}/").content.decode()
    assert "3 / 3" in detail and "rows/s" in detail and "Cancel job" not in detail
    assert client.get(f"/api/v1/jobs/{job_id}/result/").status_code == 200
    # Filters narrow the list; htmx gets the table alone.
    assert job_id not in client.get("/jobs/?status=failed").content.decode()
    part = client.get("/jobs/?kind=batch&model=mlp", HTTP_HX_REQUEST="true").content.decode()
    assert part.startswith('<div id="job-table"') and job_id in part


def test_a_running_batch_is_polled_and_cancelled_from_the_console(page_client, engineer, mlp):
    job_id = start_batch(engineer, mlp, ROWS, chunk_rows=2000, max_rows_per_second=10000)
    wait_job(engineer, job_id, what=lambda b: b["progress"]["rows_done"] > 0)
    client = page_client("engineer")
    html = client.get("/jobs/").content.decode()
    assert f'data-job="{job_id}" data-status="running"' in html
    assert 'hx-trigger="every 2s"' in html  # live while something runs
    part = client.get(f"/jobs/{job_id}/", HTTP_HX_REQUEST="true").content.decode()
    assert part.startswith('<section id="job-progress"') and 'hx-trigger="every 2s"' in part
    rows_done = int(re.search(r'<progress max="100000" value="(\d+)"', part)[1])
    assert 0 < rows_done < ROWS
    assert re.search(r"<dt>ETA</dt><dd>\d", part)  # rows left / rate, as words
    assert page_client("viewer").post(f"/jobs/{job_id}/cancel/").status_code == 403
    r = client.post(f"/jobs/{job_id}/cancel/", {"reason": "wrong dataset"}, follow=True)
    html = r.content.decode()
    assert "Job cancelled" in html and 'data-status="cancelled"' in html
    assert "cancelled by engineer: wrong dataset" in html
    event = AuditEvent.objects.get(action="job.cancel")
    assert event.actor_name == "engineer" and event.target == job_id
    r = client.post(f"/jobs/{job_id}/cancel/", follow=True)  # twice: refused, said why
    assert "job is already cancelled" in r.content.decode()


def test_the_version_page_requests_a_tensorrt_build_and_shows_its_outcome(page_client, mlp):
    from serving.core.runtime import gpu_available

    page = "/models/mlp/versions/1/"
    viewer_html = page_client("viewer").get(page).content.decode()
    assert 'id="tensorrt"' in viewer_html and "Build TensorRT engine" not in viewer_html
    assert page_client("viewer").post(f"{page}tensorrt/", {"precision": "fp16"}).status_code \
        == 403
    client = page_client("engineer")
    assert "never built" in client.get(page).content.decode()
    r = client.post(f"{page}tensorrt/", {"precision": "int3"}, follow=True)
    assert "precision: Select a valid choice" in r.content.decode()
    r = client.post(f"{page}tensorrt/", {"precision": "fp16"})
    assert r.status_code == 302 and r["Location"] == f"{page}#tensorrt"
    assert AuditEvent.objects.filter(action="version.tensorrt.requested").count() == 1

    def fp16_status() -> str:
        html = client.get(page).content.decode()
        return re.search(r'<tr data-precision="fp16" data-status="(\w+)">', html)[1]

    from tests.replicas import wait_until

    final = ("built", "failed") if gpu_available() else ("skipped",)
    wait_until(lambda: fp16_status() in final, timeout=60 if gpu_available() else 20,
               what="the build's outcome on the version page")
    if not gpu_available():
        html = client.get(page).content.decode()
        assert "no CUDA GPU on this worker" in html and "keeps serving on CPU" in html
