"""Start a batch transform from the console: pick a dataset (or upload one), a ready version and
the output format; the job's own page then follows its progress. Same services as the API's
/api/v1/datasets/ and /api/v1/models/{m}/batch/."""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from registry import selectors
from registry.errors import RegistryError
from registry.models import VersionStatus
from registry.services import jobs as job_services
from registry.store.files import FileWriter
from serving.core.tensor_signature import batch_dimension

from .access import requires, run_service
from .models import found

DATASETS_OFFERED = 50
OUTPUT_FORMATS = [("", "automatic (npy for one output, npz for more, jsonl for jsonl)"),
                  ("npy", "npy"), ("npz", "npz"), ("jsonl", "jsonl")]


class BatchForm(forms.Form):
    """Either an existing dataset or a file to upload as a new one."""

    dataset = forms.ChoiceField(required=False, label="Dataset")
    file = forms.FileField(required=False, label="…or upload a dataset",
                           help_text=".npy, .npz or .jsonl; columns named like the inputs.")
    version = forms.TypedChoiceField(coerce=int, label="Version")
    output_format = forms.ChoiceField(required=False, choices=OUTPUT_FORMATS,
                                      label="Output format")

    def __init__(self, *args, datasets=(), versions=(), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["dataset"].choices = [("", "— upload one below —")] + [
            (str(d.pk), f"{d.filename or d.pk} · {d.format} · {d.rows:,} rows") for d in datasets]
        self.fields["version"].choices = [(n, f"v{n}") for n in versions]

    def clean(self) -> dict:
        data = super().clean()
        if not data.get("dataset") and not data.get("file"):
            raise forms.ValidationError("pick a dataset or upload one")
        return data


def _offer(model, user) -> tuple[list, list[int]]:
    datasets = list(selectors.dataset_list(user).filter(expired=False)
                    .order_by("-created_at")[:DATASETS_OFFERED])
    versions = [v.number for v in model.versions.filter(status=VersionStatus.READY)
                .order_by("-number") if batch_dimension(v.signature or {})]
    return datasets, versions


@requires("engineer", write="engineer")
def batch_start(request: HttpRequest, name: str) -> HttpResponse:
    model = found(selectors.model_get, name)
    datasets, versions = _offer(model, request.user)
    form = BatchForm(request.POST or None, request.FILES or None, datasets=datasets,
                     versions=versions)
    if request.method == "POST" and form.is_valid():
        dataset_id = form.cleaned_data["dataset"]
        upload = form.cleaned_data["file"]
        if upload is not None:
            try:
                writer = FileWriter(limit=settings.MAX_UPLOAD_BYTES, what="dataset")
                writer.read_from(upload.read)
            except RegistryError as exc:
                form.add_error("file", exc.message)
            else:
                dataset = run_service(request, job_services.dataset_create, upload=writer,
                                      filename=upload.name)
                dataset_id = dataset.pk if dataset is not None else None
        if dataset_id:
            job = run_service(request, job_services.batch_create, model_name=name,
                              dataset_id=dataset_id, version_number=form.cleaned_data["version"],
                              output_format=form.cleaned_data["output_format"] or None,
                              success="Batch transform queued: its progress shows below.")
            if job is not None:
                return redirect("console:job-detail", job_id=job.pk)
    return render(request, "console/batch_form.html",
                  {"model": model, "form": form, "nav": "jobs", "has_versions": bool(versions)},
                  status=400 if request.method == "POST" else 200)
