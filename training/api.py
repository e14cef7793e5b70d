"""Jobs and runs API: parse, call one service, render."""

from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, permissions, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from config.errors import DomainError, NotPermitted
from reservations.api import path_id
from training import advice, selectors, services
from training.execution import executor_from_settings
from training.models import Run
from training.run_state import run_handle
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
            raise DomainError("no_advice", "Batch advice is for YOLO jobs with an allowed image.")
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

    @extend_schema(responses={200: RunBriefSerializer(many=True)})
    @action(detail=True)
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


class RunReportView(APIView):
    """The runner's progress reports. Its credential is the per-run bearer token, not a user."""

    authentication_classes: list = []
    permission_classes = [permissions.AllowAny]

    @extend_schema(request=dict, responses={202: dict})
    def post(self, request, pk: int):
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer "):
            raise NotPermitted("invalid_run_token", "Send the run's token as `Authorization: Bearer <token>`.")
        if not isinstance(request.data, dict):
            raise DomainError("invalid_report", "The report must be a JSON object.")
        get_object_or_404(Run.objects.only("pk"), pk=pk)
        services.run_report_record(run_id=pk, token=header[len("Bearer "):], body=request.data, now=timezone.now())
        return Response({"accepted": True}, status=status.HTTP_202_ACCEPTED)
