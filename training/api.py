"""Jobs and runs API: parse, call one service, render."""

import math
import re

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, permissions, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from config.errors import DomainError, ErrorCode, NotPermitted
from reservations.api import path_id
from training import advice, selectors, services, tuning
from training.execution import executor_from_settings
from training.run_state import run_handle
from training.safe_yaml import clip
from training.serializers import (
    AttachSerializer,
    JobSerializer,
    JobSubmitSerializer,
    RunBriefSerializer,
    RunSerializer,
)


class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = JobSerializer

    def get_queryset(self):
        jobs = selectors.jobs_visible_to(user=self.request.user)
        state = self.request.query_params.get("state")
        return jobs.filter(state=state) if state and self.action == "list" else jobs

    @extend_schema(request=JobSubmitSerializer, responses={201: JobSerializer})
    def create(self, request):
        data = JobSubmitSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        document = values["spec"] if "spec" in values else services.job_spec_from_text(text=values["spec_yaml"])
        job = services.job_submit(
            user=request.user, document=document, reservation_id=values.get("reservation"), now=timezone.now()
        )
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=JobSubmitSerializer, responses={200: dict})
    @action(detail=False, methods=["post"])
    def advice(self, request):
        """Before submit: the batch the job would get (the image's table for the GPUs), its
        defaults, and any warning in words (a batch above the table). Nothing is created."""
        data = JobSubmitSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        document = values["spec"] if "spec" in values else services.job_spec_from_text(text=values["spec_yaml"])
        found = advice.advice_for_document(document=document, reservation_id=values.get("reservation"))
        if found is None:
            raise DomainError(ErrorCode.NO_ADVICE, "Batch advice is for YOLO jobs with an allowed image.")
        return Response(found)

    @extend_schema(request=None, responses={200: JobSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        job = services.job_cancel(job_id=path_id(pk), actor=request.user, now=timezone.now())
        return Response(JobSerializer(job).data)

    @extend_schema(request=AttachSerializer, responses={200: JobSerializer})
    @action(detail=True, methods=["post"])
    def attach(self, request, pk=None):
        data = AttachSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        job = services.job_attach(
            job_id=path_id(pk), reservation_id=data.validated_data["reservation"], actor=request.user,
            now=timezone.now(),
        )
        return Response(JobSerializer(job).data)

    @extend_schema(responses={200: dict})
    @action(detail=True, url_path="tuned-spec")
    def tuned_spec(self, request, pk=None):
        """A tune job's best iteration so far and the job spec its values make: submit `spec`
        (POST /jobs/) to train with them (issue #17)."""
        best, document = tuning.job_tuned_spec(job=self.get_object())
        return Response({"iteration": best.iteration, "fitness": best.fitness,
                         "hyperparameters": best.hyperparameters, "spec": document})

    @extend_schema(responses={200: RunBriefSerializer(many=True)})
    @action(detail=True, pagination_class=None)  # a job's runs are few: a plain list (the schema says so)
    def runs(self, request, pk=None):
        job = self.get_object()
        return Response(RunBriefSerializer(job.runs.all(), many=True).data)


class RunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    def get_queryset(self):
        runs = selectors.runs_visible_to(user=self.request.user)
        if self.action == "retrieve":
            return runs.prefetch_related("metrics", "artifacts")
        return runs

    def get_serializer_class(self):
        return RunSerializer if self.action == "retrieve" else RunBriefSerializer

    @extend_schema(responses={200: dict})
    @action(detail=True)
    def log(self, request, pk=None):
        run = self.get_object()
        handle = run_handle(run)
        log = executor_from_settings().log_tail(handle, lines=200) if handle is not None else ""
        return Response({"run": run.pk, "log": log})


# What a runner may report (training/runner/progress.py): bounded so a report can neither
# smuggle markup into a page (metric values are numbers only) nor overflow a column.
MAX_METRICS = 64
METRIC_KEY = re.compile(r"^[A-Za-z0-9_.:()/+-]{1,64}$")
MAX_ARTIFACTS = 200
ARTIFACT_NAME = re.compile(r"^[A-Za-z0-9_.+-][A-Za-z0-9 _.,+()=-]{0,199}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
MAX_INT_METRIC = 2**53  # beyond this a JSON number loses precision in the browser
MAX_EPOCH = 2**31 - 1  # RunMetric.epoch / TrainingJob.epochs_done are 32-bit columns
MAX_SIZE = 2**63 - 1  # Artifact.size_bytes is a 64-bit column


def _refuse(detail: str) -> DomainError:
    return DomainError(ErrorCode.INVALID_REPORT, detail)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validated_report(body: object) -> dict:
    """The report with its numbers and names checked; raises DomainError(ErrorCode.INVALID_REPORT)."""
    if not isinstance(body, dict):
        raise _refuse("The report must be a JSON object.")
    epoch = body.get("epoch")
    if epoch is not None and (not _is_int(epoch) or not 0 <= epoch <= MAX_EPOCH):
        raise _refuse(f"`epoch` must be an integer from 0 to {MAX_EPOCH}.")
    metrics = body.get("metrics") or {}
    if not isinstance(metrics, dict) or len(metrics) > MAX_METRICS:
        raise _refuse(f"`metrics` must be an object of at most {MAX_METRICS} names.")
    for key, value in metrics.items():
        if not METRIC_KEY.match(key):
            raise _refuse(f"Metric name {clip(key)} is not 1-64 of letters, digits and _.:()/+-.")
        finite = (_is_int(value) and abs(value) <= MAX_INT_METRIC) or (
            isinstance(value, float) and math.isfinite(value)
        )
        if not finite:
            raise _refuse(f"Metric {key} must be a finite number, got {clip(value)}.")
    detail = body.get("detail") or {}
    if not isinstance(detail, dict):
        raise _refuse("`detail` must be an object.")
    if body.get("event") == "artifacts":
        items = detail.get("artifacts")
        if not isinstance(items, list) or len(items) > MAX_ARTIFACTS:
            raise _refuse(f"`artifacts` must be a list of at most {MAX_ARTIFACTS}.")
        for item in items:
            if not isinstance(item, dict):
                raise _refuse("each artifact needs name, path, size and sha256.")
            name, path, size, sha256 = (item.get(key) for key in ("name", "path", "size", "sha256"))
            if not isinstance(name, str) or not ARTIFACT_NAME.match(name) or name in {".", ".."}:
                raise _refuse(f"Artifact name {clip(name)} must be a plain file name (no '/').")
            if not isinstance(path, str) or not 0 < len(path) <= 500:
                raise _refuse("Artifact `path` must be a string of at most 500 characters.")
            if not _is_int(size) or not 0 <= size <= MAX_SIZE:
                raise _refuse(f"Artifact `size` must be an integer from 0 to {MAX_SIZE}.")
            if not isinstance(sha256, str) or not SHA256.match(sha256):
                raise _refuse("Artifact `sha256` must be 64 lowercase hex digits.")
    return body


class RunReportView(APIView):
    """The runner's progress reports. Its credential is the per-run bearer token, not a user.
    A missing run and a wrong token answer the same 404, so ids cannot be probed."""

    authentication_classes: list = []
    permission_classes = [permissions.AllowAny]

    @extend_schema(request=dict, responses={202: dict})
    def post(self, request, pk: int):
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer "):
            raise NotPermitted(ErrorCode.INVALID_RUN_TOKEN, "Send the run's token as `Authorization: Bearer <token>`.")
        run_id = path_id(pk)
        body = validated_report(request.data)
        services.run_report_record(run_id=run_id, token=header[len("Bearer "):], body=body, now=timezone.now())
        return Response({"accepted": True}, status=status.HTTP_202_ACCEPTED)
