"""deploy/kubernetes/admission-policy.yaml: schema-valid (kubernetes-validate --strict, any
warning a failure) for every supported cluster version, bound to gpubook's team namespaces,
and consistent with what the executor creates and `manage.py images configmap` writes."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.training.executors.conftest import NOW, make_spec
from training.executors.kubernetes import KubernetesConfig, build_job_manifest

POLICY = Path(__file__).resolve().parents[3] / "deploy" / "kubernetes" / "admission-policy.yaml"
DIGEST = "sha256:" + "0f" * 32


def documents() -> list[dict]:
    return list(yaml.safe_load_all(POLICY.read_text()))


@pytest.mark.parametrize("version", ["1.30", "1.31", "1.32", "1.33", "1.34", "1.35", "1.36", "1.37"])
def test_the_policy_is_schema_valid(version):
    for document in documents():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            kubernetes_validate.validate(document, version, strict=True)


def test_the_binding_denies_in_team_namespaces_with_the_catalog_as_parameter():
    policy, binding = documents()
    assert (policy["kind"], binding["kind"]) == ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {"matchLabels": {"gpubook/managed": "true"}}
    assert binding["spec"]["paramRef"] == {
        "name": "gpubook-image-catalog", "namespace": "gpubook", "parameterNotFoundAction": "Deny",
    }
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
    resources = {(tuple(rule["apiGroups"]), resource) for rule in policy["spec"]["matchConstraints"]["resourceRules"]
                 for resource in rule["resources"]}
    assert {(("batch",), "jobs"), (("",), "pods")} <= resources


def test_the_digest_pattern_admits_the_executors_image_and_not_a_tag():
    """The policy's own regular expression (RE2 in CEL; this one is also valid Python)."""
    [pattern] = set(re.findall(r"matches\('([^']+)'\)", POLICY.read_text()))
    image = f"registry.example.com/training/yolo@{DIGEST}"
    config = KubernetesConfig(image_allowlist=(image,))
    job = build_job_manifest(make_spec(image=image), config, NOW)
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert re.match(pattern, container["image"])
    for refused in ("registry.example.com/training/yolo:v8n", f"yolo@{DIGEST[:-1]}", "yolo@sha256:XYZ"):
        assert not re.match(pattern, refused)
