"""Kubernetes executor: one `batch/v1` Job per run, created with the official client.

The manifest is a pure function of (spec, config, now): `build_job_manifest`, printable with
`manifest_yaml` for review. Facts this module relies on are in shared/recipes/kubernetes.md:

- GPUs are booked as (node, count): `nodeSelector: kubernetes.io/hostname` and an
  `nvidia.com/gpu` limit; kubelet picks the devices. NVIDIA_VISIBLE_DEVICES is never set (it
  bypasses kubelet's accounting). With `dra=True` the exact GPU UUIDs are pinned through a
  ResourceClaimTemplate instead (Kubernetes >= 1.34 with NVIDIA's DRA driver).
- `backoffLimit: 0`: one run is one pod. Retrying and resuming belong to the scheduler (the
  job resumes from its checkpoint in its next slot, as a new run); a retry by the Job
  controller would start a process the calendar does not know about, e.g. restart a trainer
  that just checkpointed at its slot's end.
- `activeDeadlineSeconds` is a backstop at `must_end_by` so a slot ends even with the
  scheduler down (the pod then gets SIGTERM and `terminationGracePeriodSeconds`).
- stop = `spec.suspend=true`: the Job controller deletes the pod gracefully (SIGTERM to PID
  1, SIGKILL after the grace) and the Job object stays, so `observe` can still say the run
  was stopped. The pod is also deleted directly with the requested grace, so the grace is
  the caller's and does not wait on the controller. kill = suspend plus pod deletes with
  grace 0. `cleanup` deletes the Job with propagationPolicy=Background: the API default for
  Jobs is orphan, which leaves pods running and holding their GPUs.
- Deleted pods take their exit status with them, so a stopped run whose pod is gone is
  reported as `stopped` (exit code unknown); the runner's own report says whether it
  checkpointed. A run that ends by itself keeps its pod (until `ttlSecondsAfterFinished`),
  and its exit code and termination message are read from the pod.
- Every call has a client-side timeout and a bounded number of retries; after that
  `ExecutorUnavailable` is raised and reconcile tries again on its next tick. All calls are
  safe to repeat: names are deterministic, 409 on create reads the existing Job, 404 on
  delete is success.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import urllib3
import yaml

from training.executors.base import (
    ExecutorError,
    ExecutorUnavailable,
    Handle,
    ImageNotAllowed,
    ObservedRun,
    RunSpec,
    RunSpecMismatch,
    RunState,
    run_name,
    state_for_exit_code,
)

CONTAINER_NAME = "train"
CLAIM_NAME = "gpus"
MANAGED_BY = "gpubook"

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_INSTANCE = "gpubook/instance"
LABEL_RUN = "gpubook/run"
LABEL_JOB = "gpubook/job"
LABEL_RESERVATION = "gpubook/reservation"
LABEL_TEAM = "gpubook/team"
ANNOTATION_SPEC_HASH = "gpubook/spec-hash"
ANNOTATION_MUST_END_BY = "gpubook/must-end-by"
ANNOTATION_TEAM = "gpubook/team-name"
ANNOTATION_KILLED = "gpubook/killed"
OWN_LABELS = frozenset({LABEL_MANAGED_BY, LABEL_INSTANCE, LABEL_RUN, LABEL_JOB, LABEL_RESERVATION, LABEL_TEAM})

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_GPU_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Fa-f-]{8,64}$")
# Why a pod will not start without someone changing something (a container's waiting
# reason, or the scheduler's PodScheduled reason), and how to say so. Past the patience
# (KubernetesConfig.stuck_patience_s) observe reports such a run as failed, in these words.
STUCK_REASONS: Mapping[str, str] = {
    "ErrImagePull": "image {image} could not be pulled: {message}",
    "ImagePullBackOff": "image {image} could not be pulled: {message}",
    "InvalidImageName": "image {image} is not a valid image name: {message}",
    "CreateContainerConfigError": "the container could not be configured: {message}",
    "CreateContainerError": "the container could not be created: {message}",
    "Unschedulable": "no node can take the pod: {message}",
}

T = TypeVar("T")


@dataclass(frozen=True)
class KubernetesConfig:
    image_allowlist: tuple[str, ...]  # exact refs, or prefixes ending in "/" or "*"
    namespace_template: str = "gpubook-{team}"  # or one fixed namespace for every team
    instance: str = "default"  # label value separating two gpubook deployments on a cluster
    data_pvc: str | None = "gpubook-data"  # per namespace; mounted read-only
    data_mount_path: str = "/data"  # where the data volume's root would be
    # The parts of the data volume a team's pods see (read-only), each mounted at
    # data_mount_path/<part>; "{team}" is the team's directory name (team_dir).
    data_subpaths: tuple[str, ...] = ("{team}",)
    runs_pvc: str | None = "gpubook-runs"  # per namespace; checkpoints and outputs
    # Where the runs volume's root would be. A pod mounts only its team's part of it
    # (subPath team_dir(team)) at runs_mount_path/team_dir(team); a run's output_dir must
    # lie there, so other teams' checkpoints, spec files and report tokens are unreachable.
    runs_mount_path: str = "/runs"
    shm_size_limit: str = "16Gi"  # /dev/shm; counts toward the pod's memory
    tmp_size_limit: str = "8Gi"  # /tmp (HOME, YOLO_CONFIG_DIR); the pod is evicted past it
    default_memory: str | None = "32Gi"  # request = limit when the job names none
    # imagePullSecrets by team (team_dir) or "*" for every team: Secrets in the team's namespace.
    image_pull_secrets: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    run_as_user: int = 1000
    run_as_group: int = 1000
    fs_group: int = 1000
    read_only_root_filesystem: bool = True  # /tmp is an emptyDir, HOME=/tmp
    service_account_name: str | None = None  # its token is never mounted either way
    priority_class_name: str | None = None
    image_pull_policy: str = "IfNotPresent"
    gpu_resource_name: str = "nvidia.com/gpu"
    backoff_limit: int = 0
    ttl_seconds_after_finished: int = 86400  # keep finished pods (exit code, logs) a day
    dra: bool = False  # pin GPU UUIDs with a ResourceClaimTemplate (k8s >= 1.34)
    dra_device_class: str = "gpu.nvidia.com"
    watch_namespaces: tuple[str, ...] = ()  # always observed, on top of observe(teams=...)
    all_namespaces: bool = False  # observe cluster-wide (needs a ClusterRole to list)
    stuck_patience_s: float = 180.0  # see STUCK_REASONS
    request_timeout_s: float = 10.0
    retries: int = 2  # extra attempts after a timeout, connection error, 5xx or 429
    retry_backoff_s: float = 0.5  # doubled on each retry


# -- names ---------------------------------------------------------------------------------
def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:6]


def dns_label(text: str, max_len: int = 63) -> str:
    """`text` as a DNS-1123 label; a hash suffix keeps altered names from colliding."""
    lowered = text.lower()
    cleaned = re.sub(r"[^a-z0-9-]+", "-", lowered).strip("-")
    if cleaned == lowered and 0 < len(cleaned) <= max_len:
        return cleaned
    head = cleaned[: max_len - 7].strip("-")
    return f"{head}-{_short_hash(text)}" if head else f"x-{_short_hash(text)}"


def label_value(text: str) -> str:
    """`text` as a valid label value (<= 63 characters, alphanumeric ends)."""
    if len(text) <= 63 and _LABEL_VALUE.match(text):
        return text
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)
    cleaned = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", cleaned)[:56]
    cleaned = re.sub(r"[^A-Za-z0-9]+$", "", cleaned)
    return f"{cleaned}-{_short_hash(text)}" if cleaned else _short_hash(text)


_SAFE_DIR = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")


def team_dir(team: str) -> str:
    """The team's directory on the runs and data volumes: its slug when that is a safe path
    component (slugs are), else a DNS label of it."""
    return team if _SAFE_DIR.match(team) else dns_label(team)


def pull_secrets_for(team: str, config: KubernetesConfig) -> tuple[str, ...]:
    names = [*config.image_pull_secrets.get("*", ()), *config.image_pull_secrets.get(team_dir(team), ())]
    for name in names:
        if len(name) > 253 or not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", name):
            raise ValueError(f"bad imagePullSecret name {name!r}")
    return tuple(dict.fromkeys(names))


def namespace_for(team: str, config: KubernetesConfig) -> str:
    if "{team}" in config.namespace_template:
        namespace = config.namespace_template.format(team=dns_label(team, 40))
    else:
        namespace = config.namespace_template
    if len(namespace) > 63 or not _DNS_LABEL.match(namespace):
        raise ValueError(f"namespace {namespace!r} (from {config.namespace_template!r}) is invalid")
    return namespace


def claim_template_name(run_id: int) -> str:
    return f"{run_name(run_id)}-gpus"


def image_allowed(image: str, allowlist: Iterable[str]) -> bool:
    for entry in allowlist:
        if image == entry:
            return True
        if entry.endswith("*") and image.startswith(entry[:-1]):
            return True
        if entry.endswith("/") and image.startswith(entry):
            return True
    return False


def selector(config: KubernetesConfig, run_id: int | None = None) -> str:
    terms = [f"{LABEL_MANAGED_BY}={MANAGED_BY}", f"{LABEL_INSTANCE}={label_value(config.instance)}"]
    if run_id is not None:
        terms.append(f"{LABEL_RUN}={run_id}")
    return ",".join(terms)


# -- the manifest ---------------------------------------------------------------------------
def run_labels(spec: RunSpec, config: KubernetesConfig) -> dict[str, str]:
    labels = {
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_INSTANCE: label_value(config.instance),
        LABEL_RUN: str(spec.run_id),
        LABEL_JOB: str(spec.job_id),
        LABEL_RESERVATION: "none" if spec.reservation_id is None else str(spec.reservation_id),
        LABEL_TEAM: label_value(spec.team),
    }
    for key, value in spec.labels.items():
        if key in OWN_LABELS:
            raise ValueError(f"label {key} is set by the executor")
        prefix, _, name = key.rpartition("/")
        if (prefix and (len(prefix) > 253 or not re.match(r"^[a-z0-9.-]+$", prefix))) or not (
            len(name) <= 63 and _LABEL_NAME.match(name)
        ):
            raise ValueError(f"bad label key {key!r}")
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            raise ValueError(f"bad value {value!r} for label {key}")
        labels[key] = value
    return labels


def _join(root: str, part: str) -> str:
    return f"{root.rstrip('/')}/{part}" if part else root


def _under(path: str, directory: str) -> bool:
    normal = os.path.normpath(path)
    return normal == directory or normal.startswith(directory.rstrip("/") + "/")


def deadline_seconds(spec: RunSpec, now: datetime) -> int:
    """Seconds from `now` to `must_end_by`, rounded up; the Job's activeDeadlineSeconds."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    remaining = (spec.must_end_by - now).total_seconds()
    if remaining <= 0:
        raise ValueError(f"{spec.name}: must_end_by {spec.must_end_by.isoformat()} has passed")
    return math.ceil(remaining)


def build_job_manifest(spec: RunSpec, config: KubernetesConfig, now: datetime) -> dict[str, Any]:
    """The Job for one run. Pure: same inputs, same dict. Raises ImageNotAllowed/ValueError."""
    if not image_allowed(spec.image, config.image_allowlist):
        raise ImageNotAllowed(f"image {spec.image!r} is not in the allowlist")
    name = spec.name
    labels = run_labels(spec, config)
    env = {
        "HOME": "/tmp",  # noqa: S108 (an emptyDir; the root filesystem is read-only)
        "YOLO_CONFIG_DIR": "/tmp/Ultralytics",  # noqa: S108
        **spec.env,
        **spec.runner_env(),
    }
    resources: dict[str, dict[str, Any]] = {}
    if spec.gpu_count and not config.dra:
        resources.setdefault("limits", {})[config.gpu_resource_name] = str(spec.gpu_count)
    if spec.cpu:
        resources.setdefault("requests", {})["cpu"] = spec.cpu  # no CPU limit: no throttling
    memory = spec.memory or config.default_memory
    if memory:
        resources.setdefault("requests", {})["memory"] = memory
        resources.setdefault("limits", {})["memory"] = memory
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": config.shm_size_limit}},
        {"name": "tmp", "emptyDir": {"sizeLimit": config.tmp_size_limit}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "dshm", "mountPath": "/dev/shm"},  # noqa: S108
        {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108
    ]
    team_part = team_dir(spec.team)
    if config.data_pvc and config.data_subpaths:
        volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": config.data_pvc, "readOnly": True}})
        for part in dict.fromkeys(subpath.replace("{team}", team_part) for subpath in config.data_subpaths):
            mounts.append(
                {"name": "data", "mountPath": _join(config.data_mount_path, part), "subPath": part, "readOnly": True}
            )
    if config.runs_pvc:
        team_runs = _join(config.runs_mount_path, team_part)
        if spec.output_dir and not _under(spec.output_dir, team_runs):
            raise ValueError(f"{spec.name}: output_dir {spec.output_dir} is outside its team's runs part {team_runs}")
        volumes.append({"name": "runs", "persistentVolumeClaim": {"claimName": config.runs_pvc}})
        mounts.append({"name": "runs", "mountPath": team_runs, "subPath": team_part})

    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "imagePullPolicy": config.image_pull_policy,
        # command replaces the image's ENTRYPOINT: the argv runs as PID 1, exec form, no shell.
        "command": [spec.argv[0]],
        "args": list(spec.argv[1:]),
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        "resources": resources,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": config.read_only_root_filesystem,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": mounts,
    }
    if spec.workdir:
        container["workingDir"] = spec.workdir
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "nodeSelector": {"kubernetes.io/hostname": spec.node_name},
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,  # no service addresses injected into the environment
        "terminationGracePeriodSeconds": spec.grace_s,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": config.run_as_user,
            "runAsGroup": config.run_as_group,
            "fsGroup": config.fs_group,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    if config.service_account_name:
        pod_spec["serviceAccountName"] = config.service_account_name
    pull_secrets = pull_secrets_for(spec.team, config)
    if pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in pull_secrets]
    if config.priority_class_name:
        pod_spec["priorityClassName"] = config.priority_class_name
    if config.dra and spec.gpu_count:
        pod_spec["resourceClaims"] = [
            {"name": CLAIM_NAME, "resourceClaimTemplateName": claim_template_name(spec.run_id)}
        ]
        container["resources"]["claims"] = [{"name": CLAIM_NAME}]
    annotations = {
        ANNOTATION_SPEC_HASH: spec.spec_hash(),
        ANNOTATION_MUST_END_BY: spec.must_end_by.isoformat(),
        ANNOTATION_TEAM: spec.team,
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace_for(spec.team, config),
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "backoffLimit": config.backoff_limit,
            "activeDeadlineSeconds": deadline_seconds(spec, now),
            "ttlSecondsAfterFinished": config.ttl_seconds_after_finished,
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
        },
    }


def build_claim_template_manifest(spec: RunSpec, config: KubernetesConfig) -> dict[str, Any]:
    """DRA only: a ResourceClaimTemplate selecting exactly the booked GPUs by UUID."""
    if len(spec.gpu_uuids) != spec.gpu_count or not spec.gpu_count:
        raise ValueError(f"{spec.name}: DRA pinning needs one UUID per GPU, got {spec.gpu_uuids!r}")
    for gpu_uuid in spec.gpu_uuids:
        if not _GPU_UUID.match(gpu_uuid):  # also keeps the CEL expression injection-free
            raise ValueError(f"bad GPU UUID {gpu_uuid!r}")
    uuids = ", ".join(f'"{u}"' for u in spec.gpu_uuids)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": claim_template_name(spec.run_id),
            "namespace": namespace_for(spec.team, config),
            "labels": run_labels(spec, config),
        },
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": CLAIM_NAME,
                            "exactly": {
                                "deviceClassName": config.dra_device_class,
                                "count": spec.gpu_count,
                                "selectors": [
                                    {"cel": {"expression": (f'device.attributes["gpu.nvidia.com"].uuid in [{uuids}]')}}
                                ],
                            },
                        }
                    ]
                }
            }
        },
    }


def build_manifests(spec: RunSpec, config: KubernetesConfig, now: datetime) -> list[dict[str, Any]]:
    """Everything start() would create, in creation order."""
    job = build_job_manifest(spec, config, now)
    if config.dra and spec.gpu_count:
        return [build_claim_template_manifest(spec, config), job]
    return [job]


def manifest_yaml(spec: RunSpec, config: KubernetesConfig, now: datetime) -> str:
    return yaml.safe_dump_all(build_manifests(spec, config, now), sort_keys=False)


# -- reading what the cluster says -------------------------------------------------------------
def _attr(obj: Any, *path: str) -> Any:
    for name in path:
        if obj is None:
            return None
        obj = getattr(obj, name, None)
    return obj


def _train_container_status(pod: Any) -> Any:
    for status in _attr(pod, "status", "container_statuses") or []:
        if status.name == CONTAINER_NAME:
            return status
    return None


def _pod_sort_key(pod: Any) -> tuple[str, str]:
    created = _attr(pod, "metadata", "creation_timestamp")
    return (created.isoformat() if created else "", _attr(pod, "metadata", "name") or "")


def interpret(job: Any, pods: list[Any]) -> tuple[RunState, int | None, str, str]:
    """(state, exit code, reason, detail) of one run from its Job (or None) and pods."""
    pods = sorted(pods, key=_pod_sort_key)
    pod = pods[-1] if pods else None
    container = _train_container_status(pod)
    terminated = _attr(container, "state", "terminated")
    if terminated is not None:
        code = int(terminated.exit_code)
        message = (terminated.message or "").strip()
        return state_for_exit_code(code), code, terminated.reason or "Terminated", message[-2000:]
    phase = _attr(pod, "status", "phase")
    if pod is not None and phase in ("Failed", "Succeeded"):
        state = RunState.SUCCEEDED if phase == "Succeeded" else RunState.FAILED
        return state, None, _attr(pod, "status", "reason") or phase, (_attr(pod, "status", "message") or "")
    conditions = {c.type: c for c in (_attr(job, "status", "conditions") or []) if c.status == "True"}
    if pod is not None:  # a live pod holds its GPUs, whatever the Job's conditions say
        ending = conditions.get("FailureTarget") or conditions.get("Failed")
        if _attr(pod, "metadata", "deletion_timestamp") is not None or ending is not None:
            detail = f"{ending.reason}: " if ending is not None and ending.reason else ""
            return RunState.RUNNING, None, "Terminating", detail + "the pod is shutting down"
        if job is None:
            return RunState.RUNNING, None, "Orphaned", "pod running without its Job; kill it"
        if phase == "Running":
            return RunState.RUNNING, None, "Running", ""
        waiting = _attr(container, "state", "waiting")
        if waiting is not None and waiting.reason:
            return RunState.RUNNING, None, waiting.reason, waiting.message or ""
        for condition in _attr(pod, "status", "conditions") or []:
            if condition.type == "PodScheduled" and condition.status == "False":
                return RunState.RUNNING, None, condition.reason or "Unschedulable", (condition.message or "")
        return RunState.RUNNING, None, "Pending", ""
    if "Complete" in conditions:
        return RunState.SUCCEEDED, 0, "Completed", ""
    if "Failed" in conditions:
        failed = conditions["Failed"]
        return RunState.FAILED, None, failed.reason or "Failed", failed.message or ""
    if job is not None and _attr(job, "spec", "suspend"):
        annotations = _attr(job, "metadata", "annotations") or {}
        reason = "Killed" if annotations.get(ANNOTATION_KILLED) == "true" else "Suspended"
        return RunState.STOPPED, None, reason, "stopped; the pod and its exit code are gone"
    return RunState.RUNNING, None, "Pending", "waiting for the Job controller to create the pod"


# -- the executor -----------------------------------------------------------------------------
class KubernetesExecutor:
    kind = "kubernetes"

    def __init__(
        self,
        config: KubernetesConfig,
        *,
        client_configuration: Any = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """`client_configuration`: a kubernetes.client.Configuration (the factory loads
        kubeconfig or the in-cluster config); None loads one of those lazily. `clock`: what
        stuck pods' patience is measured with, against the cluster's creation timestamps."""
        self.config = config
        self._clock = clock
        self._client_configuration = client_configuration
        self._sleep = sleep
        self._lock = threading.Lock()
        self._clients: tuple[int, Any] | None = None
        self._namespaces: set[str] = set()  # touched by this instance; observed too

    # -- plumbing ---------------------------------------------------------------------------
    def _api_client(self) -> Any:
        """One ApiClient per process, made on first use (after a prefork worker forked)."""
        from kubernetes import client
        from kubernetes import config as kube_config

        with self._lock:
            if self._clients is None or self._clients[0] != os.getpid():
                if self._client_configuration is not None:
                    configuration = copy.deepcopy(self._client_configuration)
                else:
                    configuration = client.Configuration()
                    try:
                        kube_config.load_incluster_config(client_configuration=configuration)
                    except kube_config.ConfigException:
                        kube_config.load_kube_config(client_configuration=configuration)
                configuration.retries = 0  # our retries, counted and bounded, not urllib3's
                self._clients = (os.getpid(), client.ApiClient(configuration))
            return self._clients[1]

    def _batch(self) -> Any:
        from kubernetes import client

        return client.BatchV1Api(self._api_client())

    def _core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self._api_client())

    def _resource(self) -> Any:
        from kubernetes import client

        return client.ResourceV1Api(self._api_client())

    def _call(self, what: str, fn: Callable[..., T], *args: Any, passthrough: tuple[int, ...] = (), **kwargs: Any) -> T:
        """Call the API with a timeout and bounded retries; raise ApiException only for the
        statuses in `passthrough`, ExecutorUnavailable or ExecutorError otherwise."""
        from kubernetes.client.exceptions import ApiException

        timeout = self.config.request_timeout_s
        kwargs["_request_timeout"] = (min(timeout, 5.0), timeout)
        attempts = self.config.retries + 1
        delay = self.config.retry_backoff_s
        last = ""
        for attempt in range(attempts):
            try:
                return fn(*args, **kwargs)
            except ApiException as exc:
                if exc.status in passthrough:
                    raise
                if exc.status not in (429, 500, 502, 503, 504):
                    raise ExecutorError(f"kubernetes: {what}: {exc.status} {_api_message(exc)}") from exc
                last = f"{exc.status} {_api_message(exc)}"
            except urllib3.exceptions.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            if attempt + 1 < attempts:
                self._sleep(delay)
                delay *= 2
        raise ExecutorUnavailable(f"kubernetes: {what}: no answer after {attempts} attempts ({last})")

    def _namespace(self, handle: Handle) -> str:
        if not handle.namespace:
            raise ExecutorError(f"{handle.name}: a Kubernetes handle needs its namespace")
        return handle.namespace

    def _handle(self, run_id: int, namespace: str, uid: str | None) -> Handle:
        return Handle(run_id=run_id, name=run_name(run_id), executor=self.kind, namespace=namespace, uid=uid)

    # -- the interface ------------------------------------------------------------------------
    def start(self, spec: RunSpec, *, now: datetime | None = None) -> Handle:
        from kubernetes.client.exceptions import ApiException

        now = now or datetime.now(UTC)
        namespace = namespace_for(spec.team, self.config)
        self._namespaces.add(namespace)
        batch = self._batch()
        if spec.must_end_by <= now:  # a retry of a start may still find its Job
            existing = self._read_job(batch, spec, namespace)
            if existing is None:
                raise ValueError(f"{spec.name}: must_end_by {spec.must_end_by} has passed")
            return existing
        manifests = build_manifests(spec, self.config, now)
        for manifest in manifests[:-1]:  # the ResourceClaimTemplate, in DRA mode
            # 409: made by an earlier attempt; its content is a function of the spec.
            with contextlib.suppress(ApiException):
                self._call(
                    f"create ResourceClaimTemplate {namespace}/{manifest['metadata']['name']}",
                    self._resource().create_namespaced_resource_claim_template,
                    namespace,
                    manifest,
                    passthrough=(409,),
                )
        try:
            job = self._call(
                f"create Job {namespace}/{spec.name}",
                batch.create_namespaced_job,
                namespace,
                manifests[-1],
                passthrough=(409,),
            )
        except ApiException:  # 409 AlreadyExists: a repeated start
            existing = self._read_job(batch, spec, namespace)
            if existing is None:  # deleted between our create and read: try once more
                job = self._call(
                    f"create Job {namespace}/{spec.name}", batch.create_namespaced_job, namespace, manifests[-1]
                )
            else:
                return existing
        return self._handle(spec.run_id, namespace, job.metadata.uid)

    def _read_job(self, batch: Any, spec: RunSpec, namespace: str) -> Handle | None:
        from kubernetes.client.exceptions import ApiException

        try:
            job = self._call(
                f"read Job {namespace}/{spec.name}", batch.read_namespaced_job, spec.name, namespace, passthrough=(404,)
            )
        except ApiException:
            return None
        found = (job.metadata.annotations or {}).get(ANNOTATION_SPEC_HASH)
        if found != spec.spec_hash():
            raise RunSpecMismatch(
                f"Job {namespace}/{spec.name} exists with spec hash {found!r}, not {spec.spec_hash()!r}"
            )
        return self._handle(spec.run_id, namespace, job.metadata.uid)

    def _run_pods(self, handle: Handle) -> list[Any]:
        namespace = self._namespace(handle)
        pods = self._call(
            f"list pods of {namespace}/{handle.name}",
            self._core().list_namespaced_pod,
            namespace,
            label_selector=selector(self.config, handle.run_id),
        )
        return list(pods.items)

    def _delete_pods(self, handle: Handle, grace_s: int) -> None:
        from kubernetes.client.exceptions import ApiException

        core = self._core()
        namespace = self._namespace(handle)
        for pod in self._run_pods(handle):
            if pod.status and pod.status.phase in ("Succeeded", "Failed"):
                continue
            with contextlib.suppress(ApiException):  # 404: already gone
                self._call(
                    f"delete pod {namespace}/{pod.metadata.name}",
                    core.delete_namespaced_pod,
                    pod.metadata.name,
                    namespace,
                    grace_period_seconds=grace_s,
                    passthrough=(404,),
                )

    def _suspend(self, handle: Handle, annotations: Mapping[str, str] | None = None) -> bool:
        """Suspend the Job (the controller then deletes its pod gracefully); False if absent."""
        from kubernetes.client.exceptions import ApiException

        namespace = self._namespace(handle)
        patch: dict[str, Any] = {"spec": {"suspend": True}}
        if annotations:
            patch["metadata"] = {"annotations": dict(annotations)}
        try:
            self._call(
                f"suspend Job {namespace}/{handle.name}",
                self._batch().patch_namespaced_job,
                handle.name,
                namespace,
                patch,
                passthrough=(404, 422),
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            # 422: a finished Job cannot be suspended; it has nothing left to stop.
        return True

    def stop(self, handle: Handle, grace_s: int) -> None:
        self._namespaces.add(self._namespace(handle))
        self._suspend(handle)
        self._delete_pods(handle, grace_s)

    def kill(self, handle: Handle) -> None:
        self._namespaces.add(self._namespace(handle))
        self._suspend(handle, {ANNOTATION_KILLED: "true"})
        self._delete_pods(handle, 0)  # also catches pods whose Job is gone (orphans)

    def cleanup(self, handle: Handle) -> None:
        from kubernetes.client.exceptions import ApiException

        namespace = self._namespace(handle)
        self._delete_pods(handle, 0)
        # Background, never the API's default for Jobs (orphan: pods keep running, and GPUs).
        with contextlib.suppress(ApiException):  # 404: already gone
            self._call(
                f"delete Job {namespace}/{handle.name}",
                self._batch().delete_namespaced_job,
                handle.name,
                namespace,
                propagation_policy="Background",
                passthrough=(404,),
            )
        if self.config.dra:
            with contextlib.suppress(ApiException):
                self._call(
                    f"delete ResourceClaimTemplate {namespace}/{handle.name}",
                    self._resource().delete_namespaced_resource_claim_template,
                    claim_template_name(handle.run_id),
                    namespace,
                    passthrough=(404,),
                )

    def observe(self, *, teams: Iterable[str] = ()) -> list[ObservedRun]:
        label_selector = selector(self.config)
        batch, core = self._batch(), self._core()
        if self.config.all_namespaces:
            jobs = self._call("list Jobs", batch.list_job_for_all_namespaces, label_selector=label_selector).items
            pods = self._call("list pods", core.list_pod_for_all_namespaces, label_selector=label_selector).items
        else:
            namespaces = sorted(
                set(self.config.watch_namespaces)
                | {namespace_for(team, self.config) for team in teams}
                | self._namespaces
            )
            jobs, pods = [], []
            for namespace in namespaces:
                jobs += self._call(
                    f"list Jobs in {namespace}", batch.list_namespaced_job, namespace, label_selector=label_selector
                ).items
                pods += self._call(
                    f"list pods in {namespace}", core.list_namespaced_pod, namespace, label_selector=label_selector
                ).items
        return observe_from(jobs, pods, self.kind, now=self._clock(), stuck_patience_s=self.config.stuck_patience_s)

    def log_tail(self, handle: Handle, lines: int = 200) -> str:
        from kubernetes.client.exceptions import ApiException

        namespace = self._namespace(handle)
        pods = sorted(self._run_pods(handle), key=_pod_sort_key)
        if not pods:
            return ""
        try:
            # Raw bytes: older clients mangled JSON-looking log lines when "deserializing".
            response = self._call(
                f"read log of {namespace}/{pods[-1].metadata.name}",
                self._core().read_namespaced_pod_log,
                pods[-1].metadata.name,
                namespace,
                container=CONTAINER_NAME,
                tail_lines=lines,
                _preload_content=False,
                passthrough=(400, 404),
            )
        except ApiException:
            return ""  # container not started yet, or pod gone
        return response.data.decode("utf-8", "replace")


def _api_message(exc: Any) -> str:
    import json

    try:
        body = json.loads(exc.body or "")
        return f"{body.get('reason', '')}: {body.get('message', '')}".strip(": ")
    except (ValueError, TypeError, AttributeError):
        return str(exc.reason or "")


def _run_id_of(obj: Any) -> int | None:
    value = (_attr(obj, "metadata", "labels") or {}).get(LABEL_RUN, "")
    return int(value) if value.isdigit() else None


def stuck_reason(pods: list[Any], now: datetime, patience_s: float) -> str | None:
    """The sentence saying why the run's pod has not started, once it has been stuck (image
    pull, container config, Unschedulable) for `patience_s` since the pod was created; else None."""
    pods = sorted(pods, key=_pod_sort_key)
    pod = pods[-1] if pods else None
    if pod is None or _attr(pod, "metadata", "deletion_timestamp") is not None:
        return None
    if _attr(pod, "status", "phase") not in (None, "Pending"):
        return None
    reason = message = None
    waiting = _attr(_train_container_status(pod), "state", "waiting")
    since = _attr(pod, "metadata", "creation_timestamp")
    if waiting is not None and waiting.reason in STUCK_REASONS:
        reason, message = waiting.reason, waiting.message
    for condition in _attr(pod, "status", "conditions") or []:
        scheduled = condition.type == "PodScheduled" and condition.status == "False"
        if reason is None and scheduled and condition.reason in STUCK_REASONS:
            reason, message = condition.reason, condition.message
    if reason is None or since is None or (now - since).total_seconds() < patience_s:
        return None
    containers = _attr(pod, "spec", "containers") or []
    image = next((c.image for c in containers if c.name == CONTAINER_NAME), "?")
    return STUCK_REASONS[reason].format(image=image, message=(message or reason).strip())


def observe_from(
    jobs: Iterable[Any],
    pods: Iterable[Any],
    kind: str = "kubernetes",
    *,
    now: datetime | None = None,
    stuck_patience_s: float | None = None,
) -> list[ObservedRun]:
    """Group Jobs and pods by run and interpret each run; pure, for tests and reconcile.
    With `now` and `stuck_patience_s`, a run whose pod is stuck past the patience is FAILED."""
    by_run: dict[int, tuple[Any, list[Any], str]] = {}
    for job in jobs:
        run_id = _run_id_of(job)
        if run_id is not None:
            by_run[run_id] = (job, [], job.metadata.namespace)
    for pod in pods:
        run_id = _run_id_of(pod)
        if run_id is None:
            continue
        job, run_pods, namespace = by_run.setdefault(run_id, (None, [], pod.metadata.namespace))
        run_pods.append(pod)
    observed = []
    for run_id, (job, run_pods, namespace) in sorted(by_run.items()):
        state, exit_code, reason, detail = interpret(job, run_pods)
        if state is RunState.RUNNING and now is not None and stuck_patience_s is not None:
            stuck = stuck_reason(run_pods, now, stuck_patience_s)
            if stuck is not None:
                state, detail = RunState.FAILED, stuck
        uid = _attr(job, "metadata", "uid")
        handle = Handle(run_id=run_id, name=run_name(run_id), executor=kind, namespace=namespace, uid=uid)
        observed.append(
            ObservedRun(run_id=run_id, state=state, handle=handle, exit_code=exit_code, reason=reason, detail=detail)
        )
    return observed
