"""Console fixtures: a logged-in browser-like client per role, a small catalog and a big one."""

from __future__ import annotations

import pytest

from registry import samples, services
from registry.audit import Actor
from registry.models import Endpoint, ModelVersion, RegisteredModel

MODELS, VERSIONS = 1_000, 20


@pytest.fixture
def page_client(users):
    """page_client("viewer") -> a django.test.Client logged in (session) as that role."""
    from django.test import Client

    def make(role: str | None):
        client = Client()
        if role is not None:
            client.force_login(users[role])
        return client

    return make


@pytest.fixture
def catalog(ready_model):
    """Model "fraud" with two ready versions, alias prod -> v1; "legacy" archived."""
    ready_model("fraud", samples.mlp(seed=0), description="card fraud scorer",
                tags=["team:risk"])
    ready_model("fraud", samples.mlp(seed=1, n_out=2))
    system = Actor.system("test")
    services.alias_set(model_name="fraud", alias="prod", version_number=1, actor=system)
    services.model_create(name="legacy", tags=["old"], actor=system)
    services.model_archive(name="legacy", actor=system)
    return "fraud"


@pytest.fixture
def big_catalog(django_user_model):
    """1,000 models x 20 versions, every 3rd model deployed, created in bulk."""
    user = django_user_model.objects.create_user("eng", password="x")
    from django.contrib.auth.models import Group

    user.groups.add(Group.objects.get_or_create(name="engineer")[0])
    models = RegisteredModel.objects.bulk_create(
        RegisteredModel(name=f"model-{i:04d}", tags=["bulk", f"team:{i % 7}"], owner=user)
        for i in range(MODELS))
    ModelVersion.objects.bulk_create(
        (ModelVersion(model=m, number=n, sha256=f"{i:032x}{n:032x}", size_bytes=1000 + n,
                      status="ready" if n < VERSIONS else "validating", created_by=user,
                      signature={"inputs": [{"name": "x", "datatype": "FP32",
                                             "shape": [-1, 4]}]})
         for i, m in enumerate(models) for n in range(1, VERSIONS + 1)),
        batch_size=2_000)
    first = {v.model_id: v for v in ModelVersion.objects.filter(number=1)}
    second = {v.model_id: v for v in ModelVersion.objects.filter(number=2)}
    Endpoint.objects.bulk_create(
        Endpoint(model=m, stable=first[m.pk], candidate=second[m.pk], candidate_weight=10)
        for m in models[::3])
    return user
