from rest_framework import serializers

from reservations.serializers import MAX_ID
from training.models import Artifact, Run, RunMetric, TrainingJob


class JobSubmitSerializer(serializers.Serializer):
    spec = serializers.JSONField(help_text="The job spec as an object; or send `spec_yaml`.", required=False)
    spec_yaml = serializers.CharField(required=False, max_length=20_000)
    reservation = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=MAX_ID)

    def validate(self, attrs):
        if ("spec" in attrs) == ("spec_yaml" in attrs):
            raise serializers.ValidationError("Send exactly one of `spec` (an object) or `spec_yaml` (text).")
        return attrs


class AttachSerializer(serializers.Serializer):
    reservation = serializers.IntegerField(allow_null=True, min_value=1, max_value=MAX_ID)


class RunBriefSerializer(serializers.ModelSerializer):
    class Meta:
        model = Run
        fields = ["id", "kind", "state", "reservation", "gpu_ids", "started_at", "ended_at", "must_end_by",
                  "exit_code", "reason", "progress"]


class JobSerializer(serializers.ModelSerializer):
    image = serializers.CharField(source="image.reference")
    team = serializers.CharField(source="team.slug")
    user = serializers.CharField(source="user.username")

    class Meta:
        model = TrainingJob
        fields = ["id", "name", "team", "user", "image", "state", "reason", "priority", "gpus_needed", "reservation",
                  "epochs_done", "epochs_total", "checkpoint_path", "times_preempted", "submitted_at", "finished_at",
                  "spec", "then", "then_team", "waiting_for", "queue_position", "estimated_start",
                  "estimate_not_before", "wait_reason", "predicted_duration_s", "runtime_source"]


class MetricSerializer(serializers.ModelSerializer):
    class Meta:
        model = RunMetric
        fields = ["event", "epoch", "values", "at"]


class ArtifactSerializer(serializers.ModelSerializer):
    class Meta:
        model = Artifact
        fields = ["name", "path", "size_bytes", "sha256", "created_at"]


class RunSerializer(serializers.ModelSerializer):
    metrics = MetricSerializer(many=True, read_only=True)
    artifacts = ArtifactSerializer(many=True, read_only=True)

    class Meta:
        model = Run
        fields = [*RunBriefSerializer.Meta.fields, "job", "node", "gpu_indices", "checkpoint_path", "resumed_from",
                  "metrics", "artifacts"]
