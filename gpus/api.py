"""Telemetry API: agents post minute buckets with their node's token; people read them back.

POST /api/v1/telemetry/samples/   Authorization: Bearer <node agent token>
     {"node": "gpu-a", "buckets": [{"minute": "...Z", "index": 0, "uuid": "GPU-…", "sample_count": 12,
                                    "utilization_mean": 0.93, ...}]}
GET  /api/v1/telemetry/samples/?gpu=<id>&node=<name>&since=<iso>&until=<iso>   (any signed-in user)
"""

import datetime as dt

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, permissions, serializers, status
from rest_framework.response import Response

from config.errors import DomainError, ErrorCode, NotPermitted
from config.openapi import MAX_ID
from gpus.models import GpuSample
from gpus.telemetry import store

MAX_BUCKETS_PER_POST = 20_000
MAX_LIST_RANGE = dt.timedelta(days=7)


class InvalidNodeToken(DomainError):
    http_status = 401


class GpuSampleSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="gpu.node.name")
    index = serializers.IntegerField(source="gpu.index")
    uuid = serializers.CharField(source="gpu.uuid")

    class Meta:
        model = GpuSample
        fields = ["gpu", "node", "index", "uuid", "minute", *store.BUCKET_FIELDS]


def _time_param(params, name: str, default: dt.datetime) -> dt.datetime:
    raw = params.get(name)
    if not raw:
        return default
    try:
        value = dt.datetime.fromisoformat(raw)
    except ValueError:
        raise DomainError(ErrorCode.INVALID_TIME, f"`{name}` must be an ISO 8601 time with a UTC offset.") from None
    if value.tzinfo is None:
        raise DomainError(ErrorCode.INVALID_TIME, f"`{name}` needs a UTC offset.")
    return value


class TelemetrySamplesView(generics.ListAPIView):
    serializer_class = GpuSampleSerializer

    def get_authenticators(self):
        # The schema generator builds this view without a request.
        if getattr(self.request, "method", None) == "POST":
            return []  # the agent's node token is its only credential, checked in post()
        return super().get_authenticators()

    def get_permissions(self):
        if self.request.method == "POST":
            return [permissions.AllowAny()]  # the node token below is the credential
        return [permissions.IsAuthenticated()]

    def get_queryset(self):
        params = self.request.query_params
        now = timezone.now()
        until = _time_param(params, "until", now)
        since = _time_param(params, "since", until - dt.timedelta(hours=1))
        if since >= until or until - since > MAX_LIST_RANGE:
            raise DomainError(ErrorCode.INVALID_RANGE, "`since` must be before `until`, at most 7 days apart.")
        rows = GpuSample.objects.select_related("gpu__node").filter(minute__gte=since, minute__lt=until)
        if params.get("gpu"):
            try:
                gpu_id = int(params["gpu"])
            except ValueError:
                gpu_id = 0
            if not 1 <= gpu_id <= MAX_ID:  # past 2**63-1 the database driver itself fails
                raise DomainError(ErrorCode.INVALID_GPU, "`gpu` must be a GPU id.")
            rows = rows.filter(gpu_id=gpu_id)
        if params.get("node"):
            rows = rows.filter(gpu__node__name=params["node"])
        return rows.order_by("gpu__node__name", "gpu__index", "minute")

    @extend_schema(
        parameters=[OpenApiParameter("gpu", int), OpenApiParameter("node", str),
                    OpenApiParameter("since", str), OpenApiParameter("until", str)]
    )
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    @extend_schema(request=dict, responses={202: dict})
    def post(self, request, *args, **kwargs):
        now = timezone.now()
        header = request.headers.get("Authorization", "")
        token = header[len("Bearer "):] if header.startswith("Bearer ") else ""
        node = store.agent_token_node(token=token, now=now)
        if node is None:
            raise InvalidNodeToken(
                ErrorCode.INVALID_NODE_TOKEN, "Send a valid node agent token as `Authorization: Bearer …`."
            )
        body = request.data
        if not isinstance(body, dict) or not isinstance(body.get("buckets"), list):
            raise DomainError(ErrorCode.INVALID_SAMPLES, "Send an object with a `buckets` list.")
        if body.get("node") not in (None, node.name):
            raise NotPermitted(
                ErrorCode.WRONG_NODE, f"This token belongs to node {node.name!r}, not {body.get('node')!r}."
            )
        if len(body["buckets"]) > MAX_BUCKETS_PER_POST:
            raise DomainError(ErrorCode.TOO_MANY_BUCKETS, f"At most {MAX_BUCKETS_PER_POST} buckets per post.")
        try:
            parsed = [store.parse_bucket(raw) for raw in body["buckets"]]
            result = store.samples_record(node=node, buckets=parsed, now=now)
        except store.BadBucket as error:
            raise DomainError(ErrorCode.INVALID_SAMPLES, str(error)) from error
        return Response(
            {"stored": result.stored, "unknown_gpus": list(result.unknown_gpus)}, status=status.HTTP_202_ACCEPTED
        )
