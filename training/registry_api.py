"""Model registry API: list, a model's versions, promote, compare, download. Parse, call, render."""

from django.http import FileResponse
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from config.errors import DomainError, ErrorCode
from reservations.serializers import MAX_ID
from training import registry
from training.models import ModelVersion, RegisteredModel


class VersionSerializer(serializers.ModelSerializer):
    model = serializers.CharField(source="model.full_name")
    promoted_by = serializers.CharField(source="promoted_by.username")
    files = serializers.SerializerMethodField()

    class Meta:
        model = ModelVersion
        fields = ["model", "version", "run", "metrics", "data", "spec", "weights_sha256", "note", "promoted_by",
                  "promoted_at", "files"]

    def get_files(self, version: ModelVersion) -> list[dict]:
        files = registry.version_files(version=version)
        return [{"name": a.name, "size": a.size_bytes, "sha256": a.sha256} for a in files]


class ModelSerializer(serializers.ModelSerializer):
    full_name = serializers.CharField()
    team = serializers.CharField(source="team.slug")
    latest_version = serializers.SerializerMethodField()

    class Meta:
        model = RegisteredModel
        fields = ["id", "full_name", "team", "name", "description", "created_at", "latest_version"]

    def get_latest_version(self, model: RegisteredModel) -> int | None:
        latest = model.versions.order_by("-version").first()
        return latest.version if latest else None


class PromoteSerializer(serializers.Serializer):
    run = serializers.IntegerField(min_value=1, max_value=MAX_ID)
    name = serializers.CharField(max_length=100)
    note = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")


class ModelListView(APIView):
    @extend_schema(responses={200: ModelSerializer(many=True)})
    def get(self, request):
        return Response(ModelSerializer(registry.models_visible_to(user=request.user), many=True).data)


class PromoteView(APIView):
    @extend_schema(request=PromoteSerializer, responses={201: VersionSerializer})
    def post(self, request):
        data = PromoteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        version = registry.model_promote(run_id=values["run"], name=values["name"], note=values["note"],
                                         actor=request.user, now=timezone.now())
        return Response(VersionSerializer(version).data, status=status.HTTP_201_CREATED)


class ModelVersionsView(APIView):
    @extend_schema(responses={200: VersionSerializer(many=True)})
    def get(self, request, pk: int):
        model = registry.model_by_id(user=request.user, model_id=pk)
        return Response(VersionSerializer(model.versions.select_related("promoted_by", "model__team"), many=True).data)


def _version_number(request, name: str) -> int:
    value = request.query_params.get(name, "")
    if not value.isdigit() or not 1 <= int(value) <= MAX_ID:
        raise DomainError(ErrorCode.INVALID_VERSION, f"`{name}` must be a version number (1, 2, …).")
    return int(value)


class CompareView(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("a", int, required=True, description="a version number"),
                    OpenApiParameter("b", int, required=True, description="another version number")],
        responses={200: dict},
    )
    def get(self, request, pk: int):
        model = registry.model_by_id(user=request.user, model_id=pk)
        a, b = _version_number(request, "a"), _version_number(request, "b")
        left, right = registry.version_get(model=model, version=a), registry.version_get(model=model, version=b)
        rows = registry.version_compare(a=left, b=right)
        return Response({"model": model.full_name, "a": a, "b": b, "metrics": rows})


class VersionFileView(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("version", int, required=True, description="a version number"),
                    OpenApiParameter("name", str, required=True, description="a file of the version, e.g. best.onnx")],
        responses={(200, "application/octet-stream"): bytes},
    )
    def get(self, request, pk: int):
        model = registry.model_by_id(user=request.user, model_id=pk)
        version = _version_number(request, "version")
        name = request.query_params.get("name", "")
        path = registry.version_file_path(version=registry.version_get(model=model, version=version), name=name)
        return FileResponse(path.open("rb"), as_attachment=True, filename=f"{model.name}-v{version}-{name}")
