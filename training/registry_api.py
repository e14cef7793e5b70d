"""Model registry API: list, a model's versions, promote, compare, download. Parse, call, render."""

from django.http import FileResponse
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

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
        fields = ["full_name", "team", "name", "description", "created_at", "latest_version"]

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
    def get(self, request, team: str, name: str):
        model = registry.model_get(user=request.user, team_slug=team, name=name)
        return Response(VersionSerializer(model.versions.select_related("promoted_by", "model__team"), many=True).data)


class CompareView(APIView):
    @extend_schema(responses={200: dict})
    def get(self, request, team: str, name: str, a: int, b: int):
        model = registry.model_get(user=request.user, team_slug=team, name=name)
        left, right = registry.version_get(model=model, version=a), registry.version_get(model=model, version=b)
        rows = registry.version_compare(a=left, b=right)
        return Response({"model": model.full_name, "a": a, "b": b, "metrics": rows})


class VersionFileView(APIView):
    @extend_schema(responses={200: bytes})
    def get(self, request, team: str, name: str, version: int, filename: str):
        model = registry.model_get(user=request.user, team_slug=team, name=name)
        path = registry.version_file_path(version=registry.version_get(model=model, version=version), name=filename)
        return FileResponse(path.open("rb"), as_attachment=True, filename=f"{name}-v{version}-{filename}")
