"""deploy/kubernetes: every manifest passes kubernetes-validate --strict for 1.30–1.37,
kustomization.yaml lists them all, pods meet Pod Security "restricted", every container runs
a command that exists, and the scheduler's RBAC is exactly what the Kubernetes executor sends
to the (fake) API server during its own tests."""

import json
import os
import re
import subprocess
import sys
from collections import defaultdict

import kubernetes_validate
import pytest
import yaml

from tests.deploy.commands import problems
from tests.deploy.conftest import DEPLOY, ROOT

K8S = DEPLOY / "kubernetes"
VERSIONS = [f"1.{minor}.0" for minor in range(30, 38)]
WORKLOADS = {"Deployment", "Job", "StatefulSet", "DaemonSet"}


def load(path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.fixture(scope="module")
def kustomization() -> dict:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


@pytest.fixture(scope="module")
def objects(kustomization) -> list[dict]:
    return [doc for name in kustomization["resources"] for doc in load(K8S / name)]


def manifest_files() -> list:
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_passes_kubernetes_validate_strict(version):
    failures = []
    for path in manifest_files():
        for doc in load(path):
            name = f"{path.relative_to(K8S)}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                failures.append(f"{name}: {error.message} at {'/'.join(map(str, error.path))}")
            except kubernetes_validate.SchemaNotFoundError:  # the CLI only warns; we refuse
                failures.append(f"{name}: no schema for {doc.get('apiVersion')} {doc.get('kind')} in {version}")
    assert not failures, "\n".join(failures)


def test_strict_validation_catches_a_mistake():
    """Negative control: an unknown field is refused, so the test above can fail."""
    web = next(d for d in load(K8S / "app.yaml") if d["metadata"]["name"] == "gpubook-web")
    web["spec"]["template"]["spec"]["terminationGracePeriod"] = 30
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(web, VERSIONS[-1], strict=True)


def test_kustomization_lists_every_manifest(kustomization):
    top_level = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == top_level  # admission-policy.yaml included when present
    assert "admission-policy.yaml" in (K8S / "kustomization.yaml").read_text()  # its place is marked
    assert [image["name"] for image in kustomization["images"]] == ["gpubook-app"]


def test_the_install_has_what_a_deployment_needs(objects):
    kinds = defaultdict(set)
    for obj in objects:
        kinds[obj["kind"]].add(obj["metadata"]["name"])
    assert {"gpubook", "gpubook-vision"} <= kinds["Namespace"]
    assert {"gpubook-web", "gpubook-worker", "gpubook-beat", "gpubook-redis"} <= kinds["Deployment"]
    assert "gpubook-migrate" in kinds["Job"]
    assert {"gpubook-web"} <= kinds["Service"] and kinds["Ingress"] and kinds["NetworkPolicy"]
    assert kinds["PriorityClass"] and kinds["ConfigMap"] and kinds["Secret"] and kinds["ServiceAccount"]
    claims = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objects if o["kind"] == "PersistentVolumeClaim"}
    for namespace in ("gpubook", "gpubook-vision"):
        assert "ReadWriteMany" in claims[(namespace, "gpubook-runs")]["spec"]["accessModes"]
        assert (namespace, "gpubook-data") in claims
    beat = next(o for o in objects if o["metadata"]["name"] == "gpubook-beat")
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"


def pod_specs(objects):
    for obj in objects:
        if obj["kind"] in WORKLOADS:
            yield obj, obj["spec"]["template"]["spec"]


def test_namespaces_enforce_restricted_and_pods_comply(objects):
    for namespace in (o for o in objects if o["kind"] == "Namespace"):
        labels = namespace["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted", namespace["metadata"]["name"]
    for obj, spec in pod_specs(objects):
        name = obj["metadata"]["name"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        for container in spec.get("initContainers", []) + spec["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["capabilities"]["drop"] == ["ALL"], name
            assert context.get("readOnlyRootFilesystem") is True, name
        # Only the scheduler (the Celery worker) carries an API token.
        token = spec.get("automountServiceAccountToken")
        if name == "gpubook-worker":
            assert token is True and spec["serviceAccountName"] == "gpubook-scheduler"
        else:
            assert token is False, name


def test_every_container_command_exists(objects):
    found = {}
    for obj, spec in pod_specs(objects):
        for container in spec.get("initContainers", []) + spec["containers"]:
            if container["image"] == "gpubook-app":
                found[f"{obj['metadata']['name']}/{container['name']}"] = problems(container["command"])
    assert len(found) >= 6 and not any(found.values()), found


def test_settings_configmap_keeps_the_production_settings(objects):
    """The cluster's settings carry every key of the documented production env."""
    from tests.deploy.conftest import production_env

    data = next(o for o in objects if o["kind"] == "ConfigMap")["data"]
    expected = production_env()
    expected.pop("SECRET_KEY")
    assert set(expected) <= set(data)
    for key in ("DEBUG", "SECURE_SSL_REDIRECT", "SECURE_HSTS_SECONDS", "SECURE_PROXY_SSL_HEADER"):
        assert data[key] == expected[key], key
    assert data["EXECUTOR"] == "kubernetes"
    # Training pods report over the in-cluster Service, which must be an allowed host.
    assert data["GPUBOOK_BASE_URL"].split("//")[1].split(":")[0] in data["ALLOWED_HOSTS"].split(",")


def test_network_policy_isolates_training_pods(objects):
    policy = next(o for o in objects if o["kind"] == "NetworkPolicy")
    spec = policy["spec"]
    assert spec["podSelector"] == {} and set(spec["policyTypes"]) == {"Ingress", "Egress"}
    assert spec["ingress"] == []  # nothing reaches them
    web, dns = spec["egress"]
    assert web["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "web"
    assert web["ports"] == [{"protocol": "TCP", "port": 8000}]
    assert {p["port"] for p in dns["ports"]} == {53}


# -- RBAC against the executor ---------------------------------------------------------------
_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/[^/]+)"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<resource>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$"
)
_VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update"}


def to_rbac(method: str, path: str, query: dict) -> tuple[str, str, str, str | None]:
    """(verb, apiGroup, resource[/subresource], namespace or None) of one API request."""
    match = _PATH.match(path)
    assert match, path
    named = match["name"] is not None
    if method == "GET":
        verb = "get" if named else ("watch" if query.get("watch") in {"true", "1"} else "list")
    elif method == "DELETE":
        verb = "delete" if named else "deletecollection"
    else:
        verb = _VERBS[method]
    resource = match["resource"] + (f"/{match['sub']}" if match["sub"] else "")
    return verb, match["group"] or "", resource, match["ns"]


def granted(rules: list[dict]) -> set[tuple[str, str, str]]:
    return {
        (verb, group, resource)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def executor_test_files() -> list[str]:
    """Every test module that drives the executor against the fake API server."""
    files = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if "deploy" in path.parts or "fakes" in path.parts:
            continue
        if re.search(r"\bFakeKubernetes\b|\bfake_k8s\b", path.read_text()):
            files.append(str(path.relative_to(ROOT)))
    return files


@pytest.fixture(scope="module")
def executor_requests(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("rbac")
    log = tmp / "requests.jsonl"
    files = executor_test_files()
    assert "tests/training/executors/test_kubernetes_executor.py" in files
    # A database of its own (SQLite): this process's test database is in use.
    env = {k: v for k, v in os.environ.items() if k not in {"GPUBOOK_REQUIRE_POSTGRES", "DATABASE_URL"}}
    env.update(
        GPUBOOK_K8S_REQUEST_LOG=str(log), PYTHONPATH=str(ROOT), DATABASE_URL=f"sqlite:///{tmp}/rbac.sqlite3",
        GPUBOOK_VAR_DIR=str(tmp / "var"),
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.deploy.k8s_request_log",
         "-m", "not e2e and not training and not redis and not postgres", *files],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_role_grants_exactly_what_the_executor_calls(executor_requests, objects):
    sent = {to_rbac(r["method"], r["path"], r["query"]) for r in executor_requests}
    assert len(executor_requests) > 50 and any(verb == "create" for verb, *_ in sent)
    namespaced = {(verb, group, resource) for verb, group, resource, ns in sent if ns is not None}
    namespaces = {ns for *_, ns in sent if ns is not None}

    roles = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objects if o["kind"] == "Role"}
    bindings = [o for o in objects if o["kind"] == "RoleBinding"]
    for namespace in namespaces:  # the tests' team namespace is the one the manifests ship
        role = roles[(namespace, "gpubook-scheduler")]
        assert granted(role["rules"]) == namespaced, (
            f"Role grants beyond the executor: {sorted(granted(role['rules']) - namespaced)}; "
            f"executor needs ungranted: {sorted(namespaced - granted(role['rules']))}"
        )
        assert any(
            b["metadata"]["namespace"] == namespace and b["roleRef"] == {
                "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gpubook-scheduler"}
            and b["subjects"] == [{"kind": "ServiceAccount", "name": "gpubook-scheduler", "namespace": "gpubook"}]
            for b in bindings
        )

    # Observing every namespace (an option) needs cluster-wide LISTs: the optional ClusterRole
    # grants exactly those, and the default install does not include it.
    cluster_scoped = {(verb, group, resource) for verb, group, resource, ns in sent if ns is None}
    optional = load(K8S / "optional" / "observe-all-namespaces.yaml")
    assert granted(next(o for o in optional if o["kind"] == "ClusterRole")["rules"]) == cluster_scoped
    assert not [o for o in objects if o["kind"] in {"ClusterRole", "ClusterRoleBinding"}]


def test_no_rbac_rule_has_wildcards_or_secrets():
    for path in manifest_files():
        for obj in load(path):
            for rule in obj.get("rules", []) if obj["kind"] in {"Role", "ClusterRole"} else []:
                values = rule["apiGroups"] + rule["resources"] + rule["verbs"]
                assert "*" not in values and "secrets" not in rule["resources"], (path.name, rule)
                assert not {"pods/exec", "pods/attach", "escalate", "bind", "impersonate"} & set(values)


def test_request_mapping():
    assert to_rbac("GET", "/api/v1/namespaces/t/pods/p/log", {}) == ("get", "", "pods/log", "t")
    assert to_rbac("GET", "/apis/batch/v1/jobs", {}) == ("list", "batch", "jobs", None)
    assert to_rbac("GET", "/apis/batch/v1/namespaces/t/jobs", {"watch": "true"}) == ("watch", "batch", "jobs", "t")
    assert to_rbac("PATCH", "/apis/batch/v1/namespaces/t/jobs/j", {}) == ("patch", "batch", "jobs", "t")
    assert to_rbac("DELETE", "/api/v1/namespaces/t/pods", {}) == ("deletecollection", "", "pods", "t")
