"""REST API for model quality: feedback labels (ground truth by request id), a model's quality
points per version, and a version's task (classifier or regressor). Thin views over
registry/monitoring/feedback.py and quality.py."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from registry import audit, selectors
from registry.api.parsers import JSONParser
from registry.api.views import actor
from registry.choices import TaskType
from registry.errors import InvalidRequest
from registry.models import ModelVersion
from registry.monitoring import feedback, quality


class FeedbackView(APIView):
    """Ground truth for answered requests. Posting needs the engineer role on the model (a CI
    or application token with that role)."""

    parser_classes = [JSONParser]

    @extend_schema(request=OpenApiTypes.OBJECT, responses=OpenApiTypes.OBJECT)
    def post(self, request, name):
        """One `{"request_id", "label"}` or a batch `{"feedback": [...]}`: a label is a class
        index or name (classifiers) or a number (regressors), or a list of them, one per row of
        the request. A wrong type refuses the whole body (400 naming the field, nothing kept).
        The first label of a request id is kept; repeats count as duplicates."""
        model = selectors.model_get(name)
        items = feedback.clean(request.data)
        return Response(feedback.record(model=model, items=items))

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request, name):
        """How many labels were received, joined, pending, unknown, late and duplicate."""
        return Response(feedback.counts(selectors.model_get(name)))


class QualityView(APIView):
    read_role = "viewer"

    @extend_schema(responses=OpenApiTypes.OBJECT, parameters=[
        OpenApiParameter("seconds", int, description="how far back (default a week)")])
    def get(self, request, name):
        """Each version's quality points (per window of prediction time), its task, its
        reference (the registered evaluation metric of the same name) and the feedback counts."""
        model = selectors.model_get(name)
        try:
            seconds = int(request.query_params.get("seconds", 7 * 86400))
        except ValueError:
            raise InvalidRequest("seconds must be a whole number", field="seconds") from None
        since = timezone.now() - timedelta(seconds=max(seconds, 1))
        numbers = sorted(set(model.quality_points.filter(window_start__gte=since)
                             .values_list("version", flat=True)), reverse=True)
        versions = []
        for version in ModelVersion.objects.filter(model=model, number__in=numbers):
            task = quality.task_of(version)
            metric = quality.primary_metric(task)
            versions.append({"version": version.number, "task": task, "metric": metric,
                             "reference": quality.reference(version, metric),
                             "points": quality.series(model, version.number, since=since)})
        return Response({"model": name, "feedback": feedback.counts(model),
                         "versions": versions})


class VersionTaskView(APIView):
    parser_classes = [JSONParser]

    @extend_schema(request=OpenApiTypes.OBJECT, responses=OpenApiTypes.OBJECT)
    def put(self, request, name, number):
        """Set what the version's answers are for model quality: "classifier", "regressor",
        or "" (inferred from its output signature). Audited."""
        task = request.data.get("task") if isinstance(request.data, dict) else None
        if task not in ("", *TaskType.values):
            raise InvalidRequest('task must be "classifier", "regressor" or "" (inferred)',
                                 field="task")
        with transaction.atomic():
            version = selectors.version_get(name, number)
            version = ModelVersion.objects.select_for_update().get(pk=version.pk)
            before = {"task": version.task or None, "effective": quality.task_of(version)}
            version.task = task
            version.save(update_fields=["task"])
            after = {"task": task or None, "effective": quality.task_of(version)}
            audit.record(actor(request), "version.task", target_type="version",
                         target=str(version), model_name=name, before=before, after=after)
        return Response({"version": version.number, **after})
