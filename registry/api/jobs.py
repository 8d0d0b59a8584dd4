"""REST API for jobs: async inference, datasets, batch transforms. All of it needs the engineer
role (inputs and predictions are data, not metadata); endpoint predict keys are not accepted here,
they belong to the data plane.

    POST /api/v1/models/{m}/async-infer/[?version=N]   v2 body (JSON or binary) → 202 + job
    PUT  /api/v1/datasets/upload/?filename=x.npy         raw body → 201 dataset
    POST /api/v1/datasets/                               multipart `file` → 201 dataset
    POST /api/v1/models/{m}/batch/                       {"dataset": id, ...} → 202 + job
    POST /api/v1/models/{m}/versions/{n}/loadtest/       {"requests"|"seconds", ...} → 202 + job
    GET  /api/v1/jobs/[?kind=&status=&model=]  GET /api/v1/jobs/{id}/
    POST /api/v1/jobs/{id}/cancel/             GET /api/v1/jobs/{id}/result/
"""

from __future__ import annotations

from django.conf import settings
from django.http import FileResponse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.exceptions import APIException
from rest_framework.parsers import FileUploadParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from registry import selectors
from registry.api.integrations import IgnoreFormatParameter
from registry.api.parsers import JSONParser
from registry.api.schema import errors
from registry.api.serializers import username
from registry.api.uploads import DatasetUploadHandler
from registry.api.views import actor, valid
from registry.errors import InvalidRequest, LifecycleError, NotFound, PayloadTooLarge
from registry.jobs.progress import progress, result_url, status_url
from registry.models import Dataset, Job, JobStatus
from registry.services import jobs as svc
from registry.services import loadtests
from registry.store.files import FileWriter, job_dir

LIMIT_SLACK = 1024 * 1024


class Gone(APIException):
    status_code = 410
    default_detail = "gone"


class DatasetSerializer(serializers.ModelSerializer):
    created_by = username("created_by")

    class Meta:
        model = Dataset
        fields = ["id", "filename", "format", "size_bytes", "sha256", "rows", "columns",
                  "created_by", "created_at", "expires_at", "expired"]


class JobSerializer(serializers.ModelSerializer):
    model = serializers.CharField(source="version.model.name")
    version = serializers.IntegerField(source="version.number")
    dataset = serializers.UUIDField(source="dataset_id", allow_null=True)
    created_by = username("created_by")
    progress = serializers.SerializerMethodField()
    status_url = serializers.SerializerMethodField()
    result_url = serializers.SerializerMethodField()

    class Meta:
        model = Job
        fields = ["id", "kind", "status", "model", "version", "dataset", "params", "input_bytes",
                  "failure_reason", "attempts", "progress", "summary", "result_url",
                  "result_bytes",
                  "expires_at", "expired", "callback_url", "callback_status", "status_url",
                  "created_by", "created_at", "started_at", "finished_at"]

    def get_progress(self, obj) -> dict:
        return progress(obj)

    def get_status_url(self, obj) -> str:
        return status_url(obj)

    def get_result_url(self, obj) -> str | None:
        return result_url(obj)


class BatchSerializer(serializers.Serializer):
    dataset = serializers.UUIDField()
    version = serializers.IntegerField(min_value=1, max_value=2**31 - 1, required=False,
                                       allow_null=True)
    batch_size = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    chunk_rows = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    output_format = serializers.ChoiceField(choices=svc.OUTPUT_FORMATS, required=False,
                                            allow_null=True)
    max_rows_per_second = serializers.FloatField(min_value=0, required=False, default=0)
    callback_url = serializers.CharField(required=False, allow_blank=True, default="")
    callback_secret = serializers.CharField(required=False, allow_blank=True, default="")


class LoadTestSerializer(serializers.Serializer):
    requests = serializers.IntegerField(required=False, allow_null=True,
                                        help_text="how many requests (1 to 100000); or seconds")
    seconds = serializers.IntegerField(required=False, allow_null=True,
                                       help_text="how long (up to MMC_LOADTEST_MAX_SECONDS)")
    concurrency = serializers.IntegerField(default=1, help_text="requests in flight (up to "
                                                                "MMC_LOADTEST_MAX_CONCURRENCY)")
    replica = serializers.CharField(required=False, allow_blank=True, default="",
                                    help_text="a live replica's name (default: the embedded "
                                              "server, else the first live replica running it)")
    confirm = serializers.BooleanField(default=False, help_text="needed when the version takes "
                                                                "real traffic")
    key = serializers.CharField(required=False, allow_blank=True, default="", write_only=True,
                                help_text="a predict key, when the endpoint is protected; "
                                          "never stored")


class JobsPermission:
    read_role = write_role = "engineer"


def _version_param(request) -> int | None:
    raw = request.query_params.get("version")
    if raw in (None, ""):
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise InvalidRequest("version must be a positive integer", field="version")
    return int(raw)


def _check_declared(request, limit: int, what: str) -> None:
    declared = int(request.META.get("CONTENT_LENGTH") or 0)
    if declared > limit + LIMIT_SLACK:
        raise PayloadTooLarge(f"{what} of {declared} bytes is over the limit of {limit} bytes")


def _accepted(job: Job) -> Response:
    body = JobSerializer(Job.objects.select_related("version__model", "created_by")
                         .get(pk=job.pk)).data
    return Response(body, status=status.HTTP_202_ACCEPTED,
                    headers={"Location": body["status_url"]})


class AsyncInferView(JobsPermission, APIView):
    parser_classes = [FileUploadParser]  # never used: the body is streamed to a file by hand

    @extend_schema(
        request={"application/json": dict, "application/octet-stream": bytes},
        parameters=[OpenApiParameter("version", int),
                    OpenApiParameter("Inference-Header-Content-Length", int, "header"),
                    OpenApiParameter("X-MMC-Callback-Url", str, "header"),
                    OpenApiParameter("X-MMC-Callback-Secret", str, "header")],
        responses={202: JobSerializer})
    def post(self, request, name):
        """Queue a v2 infer request (JSON, or binary with Inference-Header-Content-Length, or
        SageMaker's binary content type) up to MMC_ASYNC_MAX_BYTES; answers 202 with the job."""
        from serving.core.errors import InvalidInput
        from serving.http.codec import sagemaker_header_length

        limit = settings.ASYNC_MAX_BYTES
        _check_declared(request, limit, "request body")
        try:
            header_length = sagemaker_header_length(request.content_type)
        except InvalidInput as exc:
            raise InvalidRequest(exc.message) from None
        raw = request.headers.get("Inference-Header-Content-Length")
        if raw not in (None, ""):
            if not raw.strip().isdigit():
                raise InvalidRequest("Inference-Header-Content-Length must be an integer")
            header_length = int(raw)
        version = _version_param(request)
        svc.resolve_version(name, version)  # refuse before reading a byte of the body
        body = FileWriter(limit=limit, what="request body").read_from(request._request.read)
        job = svc.async_create(
            model_name=name, version_number=version, body=body, header_length=header_length,
            content_encoding=request.headers.get("Content-Encoding"), actor=actor(request),
            callback_url=request.headers.get("X-MMC-Callback-Url", ""),
            callback_secret=request.headers.get("X-MMC-Callback-Secret", ""))
        return _accepted(job)


class DatasetListView(JobsPermission, generics.ListAPIView):
    serializer_class = DatasetSerializer
    parser_classes = [MultiPartParser]

    def get_queryset(self):
        return selectors.dataset_list(self.request.user)

    def initial(self, request, *args, **kwargs):
        if request.method == "POST":
            request._request.upload_handlers = [DatasetUploadHandler(request._request)]
        super().initial(request, *args, **kwargs)

    @extend_schema(request={"multipart/form-data": dict}, responses={201: DatasetSerializer})
    def post(self, request):
        """Upload a dataset (multipart `file`; optional `format` npy, npz or jsonl)."""
        _check_declared(request, settings.MAX_UPLOAD_BYTES, "dataset")
        upload = request.FILES.get("file")
        if upload is None:
            raise InvalidRequest("multipart field 'file' is missing", field="file")
        ds = svc.dataset_create(upload=upload, filename=upload.name, actor=actor(request),
                                format=request.data.get("format") or None)
        return Response(DatasetSerializer(ds).data, status=status.HTTP_201_CREATED)


class DatasetUploadView(JobsPermission, APIView):
    parser_classes = [FileUploadParser]
    content_negotiation_class = IgnoreFormatParameter  # ?format= is the dataset's

    @extend_schema(request={"application/octet-stream": bytes},
                   parameters=[OpenApiParameter("filename", str), OpenApiParameter("format", str)],
                   responses={201: DatasetSerializer})
    def put(self, request):
        """Upload a dataset as the raw body (curl --upload-file data.npy)."""
        _check_declared(request, settings.MAX_UPLOAD_BYTES, "dataset")
        filename = request.query_params.get("filename", "")
        writer = FileWriter(limit=settings.MAX_UPLOAD_BYTES, what="dataset")
        writer.read_from(request._request.read)
        ds = svc.dataset_create(upload=writer, filename=filename, actor=actor(request),
                                format=request.query_params.get("format") or None)
        return Response(DatasetSerializer(ds).data, status=status.HTTP_201_CREATED)


class DatasetDetailView(JobsPermission, APIView):
    @extend_schema(responses=DatasetSerializer)
    def get(self, request, dataset_id):
        ds = selectors.dataset_list(request.user).filter(pk=dataset_id).first()
        if ds is None:
            raise NotFound(f"dataset {dataset_id} does not exist")
        return Response(DatasetSerializer(ds).data)


class BatchView(JobsPermission, APIView):
    parser_classes = [JSONParser]

    @extend_schema(request=BatchSerializer, responses={202: JobSerializer, **errors(410)})
    def post(self, request, name):
        """Transform a dataset with a version (default: the stable one)."""
        data = valid(BatchSerializer, request.data)
        job = svc.batch_create(
            model_name=name, dataset_id=data["dataset"], actor=actor(request),
            version_number=data.get("version"), batch_size=data.get("batch_size"),
            chunk_rows=data.get("chunk_rows"), output_format=data.get("output_format"),
            max_rows_per_second=data["max_rows_per_second"], callback_url=data["callback_url"],
            callback_secret=data["callback_secret"])
        return _accepted(job)


class LoadTestView(JobsPermission, APIView):
    parser_classes = [JSONParser]

    @extend_schema(request=LoadTestSerializer, responses={202: JobSerializer, **errors(409)})
    def post(self, request, name, number):
        """Load-test the pinned version on a replica with generated inputs; the result (req/s,
        p50/p95/p99 ms, errors by status) lands in the job's `summary`."""
        data = valid(LoadTestSerializer, request.data)
        job = loadtests.loadtest_create(
            model_name=name, number=number, actor=actor(request), requests=data.get("requests"),
            seconds=data.get("seconds"), concurrency=data["concurrency"],
            replica=data["replica"], confirm=data["confirm"], key=data["key"])
        return _accepted(job)


class JobListView(JobsPermission, generics.ListAPIView):
    serializer_class = JobSerializer

    def get_queryset(self):
        params = self.request.query_params
        return selectors.job_list(kind=params.get("kind", ""), status=params.get("status", ""),
                                  model=params.get("model", ""), user=self.request.user)


class JobDetailView(JobsPermission, APIView):
    @extend_schema(responses=JobSerializer)
    def get(self, request, job_id):
        return Response(JobSerializer(selectors.job_get(job_id, request.user)).data)


class JobCancelView(JobsPermission, APIView):
    parser_classes = [JSONParser]

    @extend_schema(request=None, responses=JobSerializer)
    def post(self, request, job_id):
        reason = request.data.get("reason", "") if isinstance(request.data, dict) else ""
        svc.job_cancel(job_id=job_id, actor=actor(request), reason=str(reason)[:1000])
        return Response(JobSerializer(selectors.job_get(job_id, request.user)).data)


class JobResultView(JobsPermission, APIView):
    @extend_schema(responses={(200, "application/octet-stream"): bytes, **errors(409, 410)})
    def get(self, request, job_id):
        """The v2 response of an async job (with its headers), or a batch job's output file."""
        job = selectors.job_get(job_id, request.user)
        if job.expired:
            raise Gone(f"the result of job {job.pk} expired at {job.expires_at:%Y-%m-%d %H:%M:%S}"
                       f" UTC and was deleted")
        if job.status != JobStatus.SUCCEEDED:
            raise LifecycleError(f"job is {job.status}; there is no result"
                                 + (f" ({job.failure_reason})" if job.failure_reason else ""))
        path = job_dir(job.pk) / job.result_name
        if not path.exists():
            raise Gone(f"the result of job {job.pk} is no longer stored")
        headers = dict(job.result_headers)
        if job.kind == "async":
            response = FileResponse(open(path, "rb"),
                                    content_type=headers.pop("Content-Type", "application/json"))
        else:
            headers.pop("Content-Type", None)
            response = FileResponse(open(path, "rb"), as_attachment=True,
                                    filename=f"{job.version.model.name}-v{job.version.number}-"
                                             f"{str(job.pk)[:8]}.{path.suffix.lstrip('.')}",
                                    content_type="application/octet-stream")
        for key, value in headers.items():
            response[key] = value
        return response
