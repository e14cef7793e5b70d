"""The Job manifest: offline schema validation per supported cluster version, plus the
semantic checks the schema cannot make (security context, GPUs, no shell, deadlines)."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from datetime import timedelta

import kubernetes_validate
import pytest
import yaml
from kubernetes.client import ApiClient, V1Job

from tests.training.executors.conftest import IMAGE, NOW, make_spec
from training.executors.base import ImageNotAllowed
from training.executors.kubernetes import (
    KubernetesConfig,
    build_claim_template_manifest,
    build_job_manifest,
    build_manifests,
    dns_label,
    image_allowed,
    label_value,
    manifest_yaml,
    namespace_for,
)

# Device-plugin mode uses only fields GA by 1.30; DRA needs resource.k8s.io/v1 (GA in 1.34).
SUPPORTED_VERSIONS = ("1.30", "1.31", "1.32", "1.33", "1.34", "1.35", "1.36", "1.37")
DRA_VERSIONS = ("1.34", "1.35", "1.36", "1.37")

CONFIG = KubernetesConfig(image_allowlist=("registry.example.com/training/",))
UUIDS = ("GPU-0a1b2c3d-1111-2222-3333-444455556666", "GPU-9f8e7d6c-1111-2222-3333-444455556666")

SPECS = {
    "two-gpus": make_spec(),
    "backfill-one-gpu": make_spec(
        reservation_id=None,
        gpu_indices=(3,),
        cpu="8",
        memory="32Gi",
        workdir="/runs/vision",
        output_dir="/runs/vision/job-7",
        env={"WANDB_MODE": "offline"},
        labels={"example.com/tier": "b"},
    ),
    "cpu-only": make_spec(gpu_indices=()),
}
CONFIGS = {
    "default": CONFIG,
    "fixed-namespace-no-pvcs": replace(
        CONFIG, namespace_template="training", data_pvc=None, runs_pvc=None, read_only_root_filesystem=False
    ),
    "service-account-priority": replace(
        CONFIG, service_account_name="trainer", priority_class_name="gpubook-backfill", instance="prod"
    ),
}


def validate_strict(manifest: dict, version: str) -> None:
    """kubernetes-validate, strict, with any warning turned into a failure."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kubernetes_validate.validate(manifest, version, strict=True)


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
@pytest.mark.parametrize("config_name", sorted(CONFIGS))
@pytest.mark.parametrize("spec_name", sorted(SPECS))
def test_job_manifest_is_schema_valid(version, config_name, spec_name):
    validate_strict(build_job_manifest(SPECS[spec_name], CONFIGS[config_name], NOW), version)


@pytest.mark.parametrize("version", DRA_VERSIONS)
def test_dra_manifests_are_schema_valid(version):
    config = replace(CONFIG, dra=True)
    for manifest in build_manifests(make_spec(gpu_uuids=UUIDS), config, NOW):
        validate_strict(manifest, version)


def test_dra_is_refused_by_the_schema_before_1_34():
    claim = build_claim_template_manifest(make_spec(gpu_uuids=UUIDS), replace(CONFIG, dra=True))
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        validate_strict(claim, "1.33")


def test_the_validator_catches_a_broken_manifest():
    # Negative control: the strict check is not a rubber stamp.
    manifest = build_job_manifest(make_spec(), CONFIG, NOW)
    manifest["spec"]["template"]["spec"]["terminationGracePeriod"] = 30
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_strict(manifest, "1.34")


@pytest.mark.parametrize("spec_name", sorted(SPECS))
def test_the_client_models_accept_the_manifest_unchanged(spec_name):
    manifest = build_job_manifest(SPECS[spec_name], CONFIG, NOW)
    model = V1Job.from_dict(manifest)
    assert ApiClient().sanitize_for_serialization(model) == manifest


def test_security_context_is_restricted():
    manifest = build_job_manifest(make_spec(), CONFIG, NOW)
    pod = manifest["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False
    for forbidden in ("hostNetwork", "hostPID", "hostIPC", "nodeName", "initContainers"):
        assert forbidden not in pod
    assert all("hostPath" not in volume for volume in pod["volumes"])


@pytest.mark.parametrize("config_name", sorted(CONFIGS))
@pytest.mark.parametrize("spec_name", sorted(SPECS))
def test_pod_security_restricted_profile(config_name, spec_name):
    """The checks of the PSA "restricted" level that apply to a Job's pod template."""
    pod = build_job_manifest(SPECS[spec_name], CONFIGS[config_name], NOW)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    allowed_volume_kinds = {
        "emptyDir",
        "persistentVolumeClaim",
        "configMap",
        "secret",
        "projected",
        "downwardAPI",
        "csi",
        "ephemeral",
    }
    for volume in pod["volumes"]:
        assert set(volume) - {"name"} <= allowed_volume_kinds
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
        assert "add" not in context["capabilities"]
        assert context.get("privileged") is not True
        assert context.get("runAsUser", 1) != 0
        assert "ports" not in container


def test_gpus_are_a_count_pinned_to_the_node_never_device_ids():
    manifest = build_job_manifest(make_spec(gpu_indices=(2, 5)), CONFIG, NOW)
    pod = manifest["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert pod["nodeSelector"] == {"kubernetes.io/hostname": "gpu-node-3"}
    text = json.dumps(manifest)
    assert "NVIDIA_VISIBLE_DEVICES" not in text
    assert "CUDA_VISIBLE_DEVICES" not in text
    assert 'privileged": true' not in text


def test_cpu_only_requests_no_gpu():
    [container] = build_job_manifest(make_spec(gpu_indices=()), CONFIG, NOW)["spec"]["template"]["spec"]["containers"]
    assert container["resources"] == {"requests": {"memory": "32Gi"}, "limits": {"memory": "32Gi"}}
    no_default = replace(CONFIG, default_memory=None)
    [container] = build_job_manifest(make_spec(gpu_indices=()), no_default, NOW)["spec"]["template"]["spec"][
        "containers"
    ]
    assert container["resources"] == {}


def test_cpu_and_memory():
    [container] = build_job_manifest(make_spec(cpu="8", memory="32Gi"), CONFIG, NOW)["spec"]["template"]["spec"][
        "containers"
    ]
    assert container["resources"] == {
        "limits": {"nvidia.com/gpu": "2", "memory": "32Gi"},
        "requests": {"cpu": "8", "memory": "32Gi"},  # no CPU limit: throttling hurts loaders
    }


def test_argv_is_command_and_args_never_a_shell():
    spec = make_spec(argv=["python", "-m", "training.runner", "--name", "a; rm -rf /"])
    [container] = build_job_manifest(spec, CONFIG, NOW)["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python"]
    assert container["args"] == ["-m", "training.runner", "--name", "a; rm -rf /"]


def test_job_lifecycle_fields():
    manifest = build_job_manifest(make_spec(grace_s=300), CONFIG, NOW)
    spec = manifest["spec"]
    assert spec["backoffLimit"] == 0
    assert spec["activeDeadlineSeconds"] == 2 * 3600
    assert spec["ttlSecondsAfterFinished"] == 86400
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["terminationGracePeriodSeconds"] == 300
    assert pod["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert "suspend" not in spec


def test_deadline_counts_from_the_given_now_rounded_up():
    spec = make_spec()
    later = NOW + timedelta(minutes=90, milliseconds=300)
    assert build_job_manifest(spec, CONFIG, later)["spec"]["activeDeadlineSeconds"] == 1800
    with pytest.raises(ValueError, match="has passed"):
        build_job_manifest(spec, CONFIG, spec.must_end_by)


def test_the_builder_is_pure():
    spec = make_spec()
    assert build_job_manifest(spec, CONFIG, NOW) == build_job_manifest(spec, CONFIG, NOW)


def test_volumes_data_read_only_runs_writable_shm_in_memory():
    pod = build_job_manifest(make_spec(), CONFIG, NOW)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert volumes["data"]["persistentVolumeClaim"] == {"claimName": "gpubook-data", "readOnly": True}
    assert mounts["data"] == {"name": "data", "mountPath": "/data/vision", "subPath": "vision", "readOnly": True}
    assert volumes["runs"]["persistentVolumeClaim"] == {"claimName": "gpubook-runs"}
    assert mounts["runs"] == {"name": "runs", "mountPath": "/runs/vision", "subPath": "vision"}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert volumes["tmp"]["emptyDir"] == {"sizeLimit": "8Gi"}
    assert mounts["dshm"]["mountPath"] == "/dev/shm"
    assert mounts["tmp"]["mountPath"] == "/tmp"


def test_labels_and_annotations():
    manifest = build_job_manifest(make_spec(reservation_id=None), CONFIG, NOW)
    labels = manifest["metadata"]["labels"]
    assert labels == {
        "app.kubernetes.io/managed-by": "gpubook",
        "gpubook/instance": "default",
        "gpubook/run": "42",
        "gpubook/job": "7",
        "gpubook/reservation": "none",
        "gpubook/team": "vision",
    }
    assert manifest["spec"]["template"]["metadata"]["labels"] == labels  # pods carry them too
    assert manifest["metadata"]["name"] == "gpubook-run-42"
    assert manifest["metadata"]["namespace"] == "gpubook-vision"
    assert manifest["metadata"]["annotations"]["gpubook/spec-hash"] == make_spec(reservation_id=None).spec_hash()


def test_env_carries_the_runner_contract():
    spec = make_spec(env={"WANDB_MODE": "offline"})
    [container] = build_job_manifest(spec, CONFIG, NOW)["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["GPUBOOK_MUST_END_BY"] == "2026-05-04T11:00:00+00:00"
    assert env["GPUBOOK_RUN_ID"] == "42"
    assert env["WANDB_MODE"] == "offline"
    assert env["HOME"] == "/tmp"


@pytest.mark.parametrize("team", ["Vision Lab", "vision_lab", "ÄÖ-team", "x" * 100, "-lead-", "a.b", "__"])
def test_awkward_team_names_give_valid_names(team):
    manifest = build_job_manifest(make_spec(team=team), CONFIG, NOW)
    validate_strict(manifest, "1.34")
    namespace = manifest["metadata"]["namespace"]
    assert len(namespace) <= 63
    assert namespace == namespace_for(team, CONFIG)
    value = manifest["metadata"]["labels"]["gpubook/team"]
    assert len(value) <= 63 and value == label_value(team)
    assert manifest["metadata"]["annotations"]["gpubook/team-name"] == team


def test_altered_team_names_do_not_collide():
    assert dns_label("vision") == "vision"
    assert dns_label("vision-lab") != dns_label("vision_lab")
    assert label_value("vision lab") != label_value("vision-lab")


def test_bad_namespace_template_is_refused():
    with pytest.raises(ValueError, match="invalid"):
        namespace_for("vision", replace(CONFIG, namespace_template="Team_{team}"))


@pytest.mark.parametrize(
    ("image", "allowed"),
    [
        (IMAGE, True),
        ("registry.example.com/training/yolo@sha256:" + "a" * 64, True),
        ("registry.example.com/training-evil/yolo:v8", False),
        ("registry.example.com/trainingyolo:v8", False),
        ("docker.io/library/yolo:v8", False),
        ("yolo:v8n-cu118", True),
        ("yolo:v8n-cu118-evil", False),
        ("mirror.local/yolo:v10l-cu121", True),
    ],
)
def test_image_allowlist(image, allowed):
    allowlist = ("registry.example.com/training/", "yolo:v8n-cu118", "mirror.local/yolo:*")
    assert image_allowed(image, allowlist) is allowed


def test_an_image_outside_the_allowlist_is_refused():
    with pytest.raises(ImageNotAllowed, match="not in the allowlist"):
        build_job_manifest(make_spec(image="docker.io/evil/miner:latest"), CONFIG, NOW)
    with pytest.raises(ImageNotAllowed):
        build_job_manifest(make_spec(), replace(CONFIG, image_allowlist=()), NOW)


@pytest.mark.parametrize(
    "labels",
    [
        {"gpubook/run": "1"},
        {"app.kubernetes.io/managed-by": "me"},
        {"bad key!": "x"},
        {"ok": "bad value!"},
        {"ok": "x" * 64},
    ],
)
def test_bad_or_stolen_extra_labels_are_refused(labels):
    with pytest.raises(ValueError):
        build_job_manifest(make_spec(labels=labels), CONFIG, NOW)


def test_dra_pins_uuids_through_a_claim_template():
    config = replace(CONFIG, dra=True)
    claim, job = build_manifests(make_spec(gpu_uuids=UUIDS), config, NOW)
    assert claim["kind"] == "ResourceClaimTemplate"
    assert claim["metadata"]["name"] == "gpubook-run-42-gpus"
    request = claim["spec"]["spec"]["devices"]["requests"][0]
    assert request["exactly"]["count"] == 2
    assert request["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    expression = request["exactly"]["selectors"][0]["cel"]["expression"]
    assert expression == (f'device.attributes["gpu.nvidia.com"].uuid in ["{UUIDS[0]}", "{UUIDS[1]}"]')
    pod = job["spec"]["template"]["spec"]
    assert pod["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "gpubook-run-42-gpus"}]
    [container] = pod["containers"]
    assert container["resources"]["claims"] == [{"name": "gpus"}]
    assert "nvidia.com/gpu" not in container["resources"]["limits"]  # not both
    assert pod["nodeSelector"] == {"kubernetes.io/hostname": "gpu-node-3"}


@pytest.mark.parametrize(
    "uuids",
    [(), (UUIDS[0],), (UUIDS[0], 'GPU-x"] || true || ["')],
)
def test_dra_refuses_missing_or_malformed_uuids(uuids):
    with pytest.raises(ValueError):
        build_manifests(make_spec(gpu_uuids=uuids), replace(CONFIG, dra=True), NOW)


def test_manifest_yaml_round_trips():
    config = replace(CONFIG, dra=True)
    spec = make_spec(gpu_uuids=UUIDS)
    text = manifest_yaml(spec, config, NOW)
    assert list(yaml.safe_load_all(text)) == build_manifests(spec, config, NOW)
    assert text.index("kind: ResourceClaimTemplate") < text.index("kind: Job")
