"""Per-team isolation in the pods' manifests: two teams' Jobs side by side. A team's pod
mounts only its own part of the runs volume and of the data volume (read-only), /tmp has a
size limit, memory a limit, and image pull secrets are the team's."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.training.executors.conftest import NOW, make_spec
from tests.training.executors.test_kubernetes_manifest import validate_strict
from training.executors.kubernetes import KubernetesConfig, build_job_manifest, team_dir

CONFIG = KubernetesConfig(
    image_allowlist=("registry.example.com/training/",),
    runs_mount_path="/srv/gpubook/runs",
    data_mount_path="/srv/gpubook/datasets",
    data_subpaths=("{team}", "shared"),
    image_pull_secrets={"*": ("gpubook-registry",), "radar": ("radar-registry",)},
)


def pod_of(team: str, **spec_fields) -> dict:
    spec = make_spec(
        team=team,
        output_dir=f"/srv/gpubook/runs/{team}/job-7",
        argv=["python", "-m", "training.runner", "--spec", f"/srv/gpubook/runs/{team}/job-7/spec-run-42.json"],
        **spec_fields,
    )
    return build_job_manifest(spec, CONFIG, NOW)["spec"]["template"]["spec"]


def reachable(pod: dict) -> dict[str, tuple[str, bool]]:
    """mountPath → (the volume part it shows, read-only?) for the PVC mounts."""
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    return {
        m["mountPath"]: (f"{claims[m['name']]}:{m.get('subPath', '')}", bool(m.get("readOnly")))
        for m in pod["containers"][0]["volumeMounts"]
        if m["name"] in claims
    }


def test_two_teams_see_only_their_own_parts_of_the_volumes():
    vision, radar = pod_of("vision"), pod_of("radar")
    assert reachable(vision) == {
        "/srv/gpubook/datasets/vision": ("gpubook-data:vision", True),
        "/srv/gpubook/datasets/shared": ("gpubook-data:shared", True),
        "/srv/gpubook/runs/vision": ("gpubook-runs:vision", False),
    }
    assert reachable(radar) == {
        "/srv/gpubook/datasets/radar": ("gpubook-data:radar", True),
        "/srv/gpubook/datasets/shared": ("gpubook-data:shared", True),
        "/srv/gpubook/runs/radar": ("gpubook-runs:radar", False),
    }
    # No mount shows a volume's root (where every team's spec files and tokens live).
    for pod in (vision, radar):
        assert all(part.split(":")[1] for part, _ in reachable(pod).values())
        assert all(v["persistentVolumeClaim"].get("readOnly") for v in pod["volumes"] if v["name"] == "data")


def test_an_output_dir_outside_the_teams_part_is_refused():
    spec = make_spec(team="vision", output_dir="/srv/gpubook/runs/radar/job-9")
    with pytest.raises(ValueError, match="outside its team's runs part"):
        build_job_manifest(spec, CONFIG, NOW)
    sneaky = make_spec(team="vision", output_dir="/srv/gpubook/runs/vision/../radar/job-9")
    with pytest.raises(ValueError, match="outside"):
        build_job_manifest(sneaky, CONFIG, NOW)


def test_tmp_has_a_size_limit_and_memory_a_limit_by_default():
    pod = pod_of("vision")
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tmp"]["emptyDir"] == {"sizeLimit": "8Gi"}
    assert pod["containers"][0]["resources"]["limits"]["memory"] == "32Gi"
    assert pod["containers"][0]["resources"]["requests"]["memory"] == "32Gi"
    assert pod_of("vision", memory="64Gi")["containers"][0]["resources"]["limits"]["memory"] == "64Gi"


def test_image_pull_secrets_per_team_namespace():
    assert pod_of("vision")["imagePullSecrets"] == [{"name": "gpubook-registry"}]
    assert pod_of("radar")["imagePullSecrets"] == [{"name": "gpubook-registry"}, {"name": "radar-registry"}]
    none = build_job_manifest(make_spec(output_dir=None), replace(CONFIG, image_pull_secrets={}), NOW)
    assert "imagePullSecrets" not in none["spec"]["template"]["spec"]
    with pytest.raises(ValueError, match="imagePullSecret"):
        build_job_manifest(make_spec(output_dir=None), replace(CONFIG, image_pull_secrets={"*": ("Bad_Name",)}), NOW)


def test_team_dir_is_the_slug_or_a_safe_label():
    assert team_dir("vision-lab_2") == "vision-lab_2"
    for awkward in ("../etc", "a/b", ".", "Ä"):
        assert "/" not in team_dir(awkward) and team_dir(awkward) not in (".", "..")


@pytest.mark.parametrize("version", ["1.30", "1.37"])
def test_isolated_manifests_stay_schema_valid(version):
    validate_strict(build_job_manifest(make_spec(team="radar", output_dir="/srv/gpubook/runs/radar/job-7"), CONFIG, NOW),
                    version)
