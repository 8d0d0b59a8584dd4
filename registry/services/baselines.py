"""A version's baseline, from an uploaded dataset or from captured traffic in a window: checked
against the version's signature before anything is written, stored, audited."""

from __future__ import annotations

from datetime import UTC, datetime

from django.db import transaction

from registry.audit import Actor, record
from registry.errors import InvalidRequest, NotFound
from registry.jobs.batch import match_columns
from registry.models import Baseline, Dataset, ModelVersion
from registry.monitoring import baselines
from registry.services.catalog import lock_model
from registry.store.files import ArraySource, dataset_path

#: The most dataset rows a baseline reads (a uniform prefix would bias it: rows are read whole).
MAX_ROWS = 5_000_000


def _version(model_name: str, number: int) -> ModelVersion:
    model = lock_model(model_name, allow_archived=True)
    version = ModelVersion.objects.select_for_update().filter(model=model, number=number).first()
    if version is None:
        raise NotFound(f"version {number} of {model_name!r} does not exist", field="version")
    return version


def _fitting(columns: dict, signature: dict) -> dict[str, str]:
    """match_columns's mapping, its refusal re-raised with the field naming the input tensor
    (dataset.<input>) when one input is to blame."""
    try:
        return match_columns(columns, signature)
    except InvalidRequest as refused:
        message = str(refused)
        for spec in signature.get("inputs") or []:
            if message.startswith(f"input {spec['name']}") \
                    or f"input(s) {spec['name']}" in message:
                raise InvalidRequest(message, field=f"dataset.{spec['name']}") from None
        raise


def _summary(b: Baseline) -> dict:
    return {"source": b.source, "rows": b.rows,
            "features": sum(len(v) for v in b.features.values())}


def _store(version: ModelVersion, actor: Actor, **fields) -> Baseline:
    before = None
    old = Baseline.objects.filter(version=version).first()
    if old is not None:
        before = _summary(old)
        old.delete()
    baseline = Baseline.objects.create(version=version, created_by=actor.user, **fields)
    record(actor, "version.baseline", target_type="version", target=str(version),
           model_name=version.model.name, before=before, after=_summary(baseline))
    return baseline


def baseline_from_dataset(*, model_name: str, version_number: int, dataset_id,
                          actor: Actor) -> Baseline:
    """Statistics of the inputs in an uploaded .npy/.npz dataset. A dataset whose arrays do not
    match the version's input signature is refused naming the tensor, its dtype or shape."""
    with transaction.atomic():
        version = _version(model_name, version_number)
        dataset = Dataset.objects.filter(pk=dataset_id, expired=False).first()
        if dataset is None:
            raise NotFound(f"dataset {dataset_id} does not exist", field="dataset")
        if dataset.format == "jsonl":
            raise InvalidRequest("a baseline reads .npy or .npz datasets (one array per input)",
                                 field="dataset")
        mapping = _fitting(dataset.columns, version.signature)
        if (dataset.rows or 0) > MAX_ROWS:
            raise InvalidRequest(f"the dataset has {dataset.rows} rows; a baseline reads at most "
                                 f"{MAX_ROWS}", field="dataset")
        source = ArraySource(dataset_path(dataset), dataset.format)
        try:
            arrays = {name: source.read(column, 0, dataset.rows or 0)
                      for name, column in mapping.items()}
        finally:
            source.close()
        features = baselines.summarise_arrays({"inputs": arrays, "outputs": {}})
        return _store(version, actor, source="dataset", dataset=dataset,
                      rows=dataset.rows or 0, features=features)


def baseline_from_capture(*, model_name: str, version_number: int, since: float, until: float,
                          actor: Actor, store=None) -> Baseline:
    """Statistics of a version's captured inputs and outputs taken in [since, until]."""
    if not until > since:
        raise InvalidRequest("the window's end must come after its start", field="until")
    features, rows = baselines.from_capture(model_name, version=version_number, since=since,
                                            until=until, store=store)
    if rows == 0:
        raise InvalidRequest(f"no captured traffic of version {version_number} in the window",
                             field="since")
    with transaction.atomic():
        version = _version(model_name, version_number)
        return _store(version, actor, source="capture", rows=rows, features=features,
                      window_start=datetime.fromtimestamp(since, UTC),
                      window_end=datetime.fromtimestamp(until, UTC))
