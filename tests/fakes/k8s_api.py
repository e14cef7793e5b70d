"""A wire-level fake Kubernetes API server on loopback, for the real `kubernetes` client.

Tests point a `kubernetes.client.Configuration` at `fake.url` and exercise the executor's
actual HTTP traffic: paths, query parameters (propagationPolicy, labelSelector,
gracePeriodSeconds, tailLines), patch content types, Status bodies and status codes.

What it serves (enough for the Kubernetes executor, not a general apiserver):
- batch/v1 Jobs: create (409 AlreadyExists as a real Status), get, list (per namespace or
  all, with equality-based labelSelector), strategic/merge patch, delete (the
  propagationPolicy decides what happens to the Job's pods: Background/Foreground mark
  them terminating, Orphan or none leaves them running, as the real default does);
- v1 Pods: list, get, status, log (text/plain, tailLines), delete (gracePeriodSeconds=0
  removes at once, otherwise the pod is marked terminating);
- resource.k8s.io/v1 ResourceClaimTemplates: create, get, delete.

The cluster's controllers and kubelet are played by the test through scripting methods
(`add_pod`, `set_pod_waiting`, `terminate_pod`, `set_job_condition`,
`complete_deletions`), so each test states the lifecycle it needs. Suspending a Job marks
its active pods terminating, as the Job controller does. Or, with `kubelet=FakeKubelet(...)`,
a Job controller and kubelet run each Job's container as a real local process, signal it on
pod deletion and report how it ended (see FakeKubelet).

Faults: `fail(method, path_regex, status, times)` answers with a Status error;
`delay(method, path_regex, seconds, times)` answers late (to trip client timeouts).
Every request is recorded in `requests` (method, path, query, headers, body).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: Any
    at: float = field(default_factory=time.time)  # when it arrived (wall clock), for timing


@dataclass
class _Fault:
    method: str
    path: re.Pattern[str]
    times: int
    status: int = 500
    delay_s: float = 0.0


@dataclass
class _Store:
    jobs: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    claim_templates: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    logs: dict[tuple[str, str], str] = field(default_factory=dict)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "details": details or {},
        "code": code,
    }


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """JSON merge patch (RFC 7386); strategic merge behaves the same for what we patch."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


def label_selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """Equality-based selectors: `a=b`, `a==b`, `a!=b`, `a`, `!a`, joined by commas."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.split("==", 1) if "==" in term else term.split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


class _ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.body = status_body(code, reason, message, details)


class FakeKubernetes:
    def __init__(self, *, validate_version: str | None = None, kubelet: FakeKubelet | None = None) -> None:
        """`validate_version`: also answer 422 Invalid for a Job that kubernetes-validate
        (strict) rejects for that cluster version, as an admission check would.
        `kubelet`: play the Job controller and kubelet for real (see FakeKubelet) instead of
        leaving the pod lifecycle to the test's scripting calls."""
        self.validate_version = validate_version
        self.kubelet = kubelet
        self.store = _Store()
        self.requests: list[RecordedRequest] = []
        self._faults: list[_Fault] = []
        self._lock = threading.RLock()
        self._closing = threading.Event()
        self._resource_version = 1000
        self._pod_serial = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> FakeKubernetes:
        fake = self

        class Handler(_Handler):
            pass

        Handler.fake = fake
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self._thread.start()
        if self.kubelet is not None:
            self.kubelet.attach(self)
        return self

    def stop(self) -> None:
        self._closing.set()  # releases handlers sleeping in an injected delay
        if self.kubelet is not None:
            self.kubelet.shutdown()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> FakeKubernetes:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def client_configuration(self, token: str = "fake-token") -> Any:  # noqa: S107
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        configuration.api_key = {"authorization": token}
        configuration.api_key_prefix = {"authorization": "Bearer"}
        return configuration

    # -- fault injection ------------------------------------------------------------------
    def fail(self, method: str, path_regex: str, status: int = 500, times: int = 1) -> None:
        with self._lock:
            self._faults.append(_Fault(method.upper(), re.compile(path_regex), times, status))

    def delay(self, method: str, path_regex: str, seconds: float, times: int = 1) -> None:
        with self._lock:
            self._faults.append(_Fault(method.upper(), re.compile(path_regex), times, 0, delay_s=seconds))

    def _take_fault(self, method: str, path: str) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.times > 0 and fault.method == method and fault.path.search(path):
                    fault.times -= 1
                    return fault
        return None

    # -- assertions -----------------------------------------------------------------------
    def requests_for(self, method: str | None = None, path_regex: str = "") -> list[RecordedRequest]:
        with self._lock:
            return [
                r
                for r in self.requests
                if (method is None or r.method == method.upper()) and re.search(path_regex, r.path)
            ]

    def job(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return copy.deepcopy(self.store.jobs.get((namespace, name)))

    def pods_of(self, namespace: str, job_name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [
                copy.deepcopy(p)
                for (ns, _), p in self.store.pods.items()
                if ns == namespace and p["metadata"]["labels"].get("batch.kubernetes.io/job-name") == job_name
            ]

    # -- scripting: the job controller and kubelet, played by the test ---------------------
    def _next_rv(self) -> str:
        self._resource_version += 1
        return str(self._resource_version)

    def add_pod(self, namespace: str, job_name: str, *, phase: str = "Running") -> str:
        """Create the Job's pod from its template; Running gets a running container."""
        with self._lock:
            job = self.store.jobs[(namespace, job_name)]
            template = job["spec"]["template"]
            self._pod_serial += 1  # never len(pods): a name must not come back after a delete
            suffix = hashlib.sha256(f"{job_name}{self._pod_serial}".encode()).hexdigest()[:5]
            name = f"{job_name}-{suffix}"
            spec = copy.deepcopy(template["spec"])
            spec["nodeName"] = spec.get("nodeSelector", {}).get("kubernetes.io/hostname", "node-1")
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "uid": str(uuid.uuid4()),
                    "resourceVersion": self._next_rv(),
                    "creationTimestamp": _now(),
                    "labels": dict(template["metadata"].get("labels", {})),
                    "ownerReferences": [
                        {
                            "apiVersion": "batch/v1",
                            "kind": "Job",
                            "name": job_name,
                            "uid": job["metadata"]["uid"],
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "spec": spec,
                "status": {"phase": "Pending"},
            }
            self.store.pods[(namespace, name)] = pod
            job["status"]["active"] = job["status"].get("active", 0) + 1
            job["status"].setdefault("startTime", _now())
            if phase == "Running":
                self._set_container(pod, {"running": {"startedAt": _now()}}, ready=True)
                pod["status"]["phase"] = "Running"
            return name

    def _set_container(self, pod: dict, state: dict, ready: bool = False) -> None:
        container = pod["spec"]["containers"][0]
        pod["status"]["containerStatuses"] = [
            {
                "name": container["name"],
                "image": container["image"],
                "imageID": "",
                "ready": ready,
                "restartCount": 0,
                "started": ready,
                "state": state,
            }
        ]
        pod["metadata"]["resourceVersion"] = self._next_rv()

    def set_pod_waiting(self, namespace: str, pod_name: str, reason: str, message: str = "") -> None:
        with self._lock:
            pod = self.store.pods[(namespace, pod_name)]
            pod["status"]["phase"] = "Pending"
            self._set_container(pod, {"waiting": {"reason": reason, "message": message}})

    def set_pod_unschedulable(self, namespace: str, pod_name: str, message: str) -> None:
        with self._lock:
            pod = self.store.pods[(namespace, pod_name)]
            pod["status"] = {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": message,
                    }
                ],
            }

    def terminate_pod(
        self,
        namespace: str,
        pod_name: str,
        exit_code: int,
        *,
        reason: str | None = None,
        message: str = "",
    ) -> None:
        """The container ends with `exit_code`; the Job's counters follow (backoffLimit 0)."""
        with self._lock:
            pod = self.store.pods[(namespace, pod_name)]
            terminated = {
                "exitCode": exit_code,
                "reason": reason or ("Completed" if exit_code == 0 else "Error"),
                "startedAt": _now(),
                "finishedAt": _now(),
            }
            if message:
                terminated["message"] = message
            self._set_container(pod, {"terminated": terminated})
            pod["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"
            job_name = pod["metadata"]["labels"]["batch.kubernetes.io/job-name"]
            job = self.store.jobs.get((namespace, job_name))
            if job is None or job["spec"].get("suspend"):
                return  # pods ended by a suspension count as neither success nor failure
            status = job["status"]
            status["active"] = max(0, status.get("active", 0) - 1)
            if exit_code == 0:
                status["succeeded"] = status.get("succeeded", 0) + 1
                self._add_condition(job, "Complete", "CompletionsReached", "")
            else:
                status["failed"] = status.get("failed", 0) + 1
                self._add_condition(
                    job, "Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit"
                )

    def set_job_condition(self, namespace: str, job_name: str, type_: str, reason: str, message: str = "") -> None:
        with self._lock:
            self._add_condition(self.store.jobs[(namespace, job_name)], type_, reason, message)

    def _add_condition(self, job: dict, type_: str, reason: str, message: str) -> None:
        job["status"].setdefault("conditions", []).append(
            {
                "type": type_,
                "status": "True",
                "reason": reason,
                "message": message,
                "lastProbeTime": _now(),
                "lastTransitionTime": _now(),
            }
        )
        job["metadata"]["resourceVersion"] = self._next_rv()

    def set_log(self, namespace: str, pod_name: str, text: str) -> None:
        with self._lock:
            self.store.logs[(namespace, pod_name)] = text

    def complete_deletions(self) -> None:
        """Kubelet confirms every terminating pod gone (its grace is over)."""
        with self._lock:
            for key, pod in list(self.store.pods.items()):
                if pod["metadata"].get("deletionTimestamp"):
                    self._remove_pod(key)

    def _remove_pod(self, key: tuple[str, str]) -> None:
        pod = self.store.pods.pop(key)
        job_name = pod["metadata"]["labels"].get("batch.kubernetes.io/job-name")
        job = self.store.jobs.get((key[0], job_name or ""))
        if job is not None and pod["status"].get("phase") in ("Pending", "Running"):
            job["status"]["active"] = max(0, job["status"].get("active", 0) - 1)

    def _mark_terminating(self, key: tuple[str, str], grace: int | None) -> None:
        pod = self.store.pods[key]
        if grace == 0 or pod["status"].get("phase") in ("Succeeded", "Failed"):
            self._remove_pod(key)
            return
        meta = pod["metadata"]
        if grace is None:
            grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
        current = meta.get("deletionGracePeriodSeconds")
        meta["deletionTimestamp"] = meta.get("deletionTimestamp") or _now()
        # A second delete may shorten the grace, never lengthen it.
        meta["deletionGracePeriodSeconds"] = grace if current is None else min(current, grace)
        meta["resourceVersion"] = self._next_rv()

    # -- the API --------------------------------------------------------------------------
    def handle(self, method: str, path: str, query: dict[str, str], body: Any, content_type: str) -> tuple[int, Any]:
        routes = [
            (r"^/apis/batch/v1/jobs$", {"GET": self._list_jobs}),
            (r"^/apis/batch/v1/namespaces/(?P<ns>[^/]+)/jobs$", {"GET": self._list_jobs, "POST": self._create_job}),
            (
                r"^/apis/batch/v1/namespaces/(?P<ns>[^/]+)/jobs/(?P<name>[^/]+)$",
                {"GET": self._get_job, "PATCH": self._patch_job, "DELETE": self._delete_job},
            ),
            (r"^/api/v1/pods$", {"GET": self._list_pods}),
            (r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods$", {"GET": self._list_pods}),
            (
                r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)(?P<sub>/status)?$",
                {"GET": self._get_pod, "DELETE": self._delete_pod},
            ),
            (r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)/log$", {"GET": self._pod_log}),
            (
                r"^/apis/resource.k8s.io/v1/namespaces/(?P<ns>[^/]+)/resourceclaimtemplates$",
                {"POST": self._create_claim_template},
            ),
            (
                r"^/apis/resource.k8s.io/v1/namespaces/(?P<ns>[^/]+)/resourceclaimtemplates/(?P<name>[^/]+)$",
                {"GET": self._get_claim_template, "DELETE": self._delete_claim_template},
            ),
        ]
        for pattern, methods in routes:
            match = re.match(pattern, path)
            if match:
                if method not in methods:
                    raise _ApiError(405, "MethodNotAllowed", f"{method} not allowed on {path}")
                with self._lock:
                    return methods[method](**match.groupdict(), query=query, body=body, content_type=content_type)
        raise _ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")

    def _select(self, objects: dict, ns: str | None, query: dict[str, str]) -> list[dict]:
        selector = query.get("labelSelector", "")
        return [
            copy.deepcopy(obj)
            for (obj_ns, _), obj in sorted(objects.items())
            if (ns is None or obj_ns == ns) and label_selector_matches(selector, obj["metadata"].get("labels", {}))
        ]

    def _list(self, kind: str, api_version: str, items: list[dict]) -> tuple[int, dict]:
        return 200, {
            "kind": kind,
            "apiVersion": api_version,
            "metadata": {"resourceVersion": str(self._resource_version)},
            "items": items,
        }

    def _list_jobs(self, query: dict, ns: str | None = None, **_: Any) -> tuple[int, dict]:
        return self._list("JobList", "batch/v1", self._select(self.store.jobs, ns, query))

    def _list_pods(self, query: dict, ns: str | None = None, **_: Any) -> tuple[int, dict]:
        return self._list("PodList", "v1", self._select(self.store.pods, ns, query))

    def _create_job(self, ns: str, body: Any, query: dict, content_type: str, **_: Any) -> tuple[int, dict]:
        # An empty Content-Type means JSON to the apiserver (its first supported media type).
        if content_type not in ("", "application/json"):
            raise _ApiError(415, "UnsupportedMediaType", f"unsupported media type {content_type}")
        if not isinstance(body, dict) or body.get("kind") != "Job":
            raise _ApiError(400, "BadRequest", "expected a Job")
        meta = body.setdefault("metadata", {})
        name = meta.get("name", "")
        if not _DNS_LABEL.match(name):
            raise _ApiError(422, "Invalid", f'Job.batch "{name}" is invalid: metadata.name')
        if meta.get("namespace", ns) != ns:
            raise _ApiError(400, "BadRequest", "the namespace of the object does not match")
        if (ns, name) in self.store.jobs:
            raise _ApiError(
                409,
                "AlreadyExists",
                f'jobs.batch "{name}" already exists',
                {"name": name, "group": "batch", "kind": "jobs"},
            )
        if self.validate_version:
            import kubernetes_validate

            try:
                kubernetes_validate.validate(body, self.validate_version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                raise _ApiError(422, "Invalid", f'Job.batch "{name}" is invalid: {exc}') from exc
        if query.get("dryRun"):
            return 201, body
        job = copy.deepcopy(body)
        uid = str(uuid.uuid4())
        meta = job["metadata"]
        meta.update(
            namespace=ns,
            uid=uid,
            resourceVersion=self._next_rv(),
            generation=1,
            creationTimestamp=_now(),
        )
        controller_labels = {
            "batch.kubernetes.io/controller-uid": uid,
            "batch.kubernetes.io/job-name": name,
            "controller-uid": uid,
            "job-name": name,
        }
        job["spec"]["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
        job["spec"]["template"].setdefault("metadata", {}).setdefault("labels", {}).update(controller_labels)
        job["status"] = {}
        self.store.jobs[(ns, name)] = job
        return 201, copy.deepcopy(job)

    def _get_job(self, ns: str, name: str, **_: Any) -> tuple[int, dict]:
        job = self.store.jobs.get((ns, name))
        if job is None:
            raise _ApiError(
                404, "NotFound", f'jobs.batch "{name}" not found', {"name": name, "group": "batch", "kind": "jobs"}
            )
        return 200, copy.deepcopy(job)

    def _patch_job(self, ns: str, name: str, body: Any, content_type: str, **_: Any) -> tuple[int, dict]:
        self._get_job(ns, name)
        if content_type not in (
            "application/strategic-merge-patch+json",
            "application/merge-patch+json",
        ):
            raise _ApiError(415, "UnsupportedMediaType", f"unsupported patch type {content_type}")
        job = self.store.jobs[(ns, name)]
        was_suspended = bool(job["spec"].get("suspend"))
        _merge(job, body)
        job["metadata"]["resourceVersion"] = self._next_rv()
        if job["spec"].get("suspend") and not was_suspended:
            # The Job controller deletes active pods; they terminate with their grace.
            for key, pod in list(self.store.pods.items()):
                if key[0] == ns and pod["metadata"]["labels"].get("batch.kubernetes.io/job-name") == name:
                    self._mark_terminating(key, None)
            self._add_condition(job, "Suspended", "JobSuspended", "Job suspended")
            job["status"].pop("startTime", None)
        return 200, copy.deepcopy(job)

    def _delete_job(self, ns: str, name: str, query: dict, body: Any, **_: Any) -> tuple[int, dict]:
        self._get_job(ns, name)
        job = self.store.jobs.pop((ns, name))
        options = body if isinstance(body, dict) else {}
        policy = query.get("propagationPolicy") or options.get("propagationPolicy") or "Orphan"
        for key, pod in list(self.store.pods.items()):
            owners = pod["metadata"].get("ownerReferences", [])
            if key[0] != ns or not any(o.get("uid") == job["metadata"]["uid"] for o in owners):
                continue
            if policy in ("Background", "Foreground"):
                self._mark_terminating(key, None)
            else:  # Orphan: the pods keep running, and keep their GPUs
                pod["metadata"]["ownerReferences"] = []
        return 200, status_body(
            200, "", "", {"name": name, "group": "batch", "kind": "jobs", "uid": job["metadata"]["uid"]}
        )

    def _get_pod(self, ns: str, name: str, **_: Any) -> tuple[int, dict]:
        pod = self.store.pods.get((ns, name))
        if pod is None:
            raise _ApiError(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
        return 200, copy.deepcopy(pod)

    def _delete_pod(self, ns: str, name: str, query: dict, body: Any, **_: Any) -> tuple[int, dict]:
        _, pod = self._get_pod(ns, name)
        options = body if isinstance(body, dict) else {}
        grace = query.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
        self._mark_terminating((ns, name), None if grace is None else int(grace))
        return 200, pod

    def _pod_log(self, ns: str, name: str, query: dict, **_: Any) -> tuple[int, str]:
        self._get_pod(ns, name)
        text = self.store.logs.get((ns, name), "")
        if "tailLines" in query:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-int(query["tailLines"]) :]) if int(query["tailLines"]) else ""
        return 200, text

    def _create_claim_template(self, ns: str, body: Any, **_: Any) -> tuple[int, dict]:
        name = body["metadata"]["name"]
        if (ns, name) in self.store.claim_templates:
            raise _ApiError(
                409,
                "AlreadyExists",
                f'resourceclaimtemplates.resource.k8s.io "{name}" already exists',
                {"name": name, "group": "resource.k8s.io", "kind": "resourceclaimtemplates"},
            )
        template = copy.deepcopy(body)
        template["metadata"].update(
            namespace=ns, uid=str(uuid.uuid4()), resourceVersion=self._next_rv(), creationTimestamp=_now()
        )
        self.store.claim_templates[(ns, name)] = template
        return 201, copy.deepcopy(template)

    def _get_claim_template(self, ns: str, name: str, **_: Any) -> tuple[int, dict]:
        template = self.store.claim_templates.get((ns, name))
        if template is None:
            raise _ApiError(404, "NotFound", f'resourceclaimtemplates "{name}" not found')
        return 200, copy.deepcopy(template)

    def _delete_claim_template(self, ns: str, name: str, **_: Any) -> tuple[int, dict]:
        _, template = self._get_claim_template(ns, name)
        del self.store.claim_templates[(ns, name)]
        return 200, template


# Called as listener(method, path, query) for every request any fake receives: the deployment
# tests derive the scheduler's RBAC from what the executor really sends (tests/deploy/).
REQUEST_LISTENERS: list[Any] = []


class _Handler(BaseHTTPRequestHandler):
    fake: FakeKubernetes
    protocol_version = "HTTP/1.1"  # keep-alive, like a real apiserver

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        pass

    def _dispatch(self) -> None:
        fake = self.fake
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            body = raw.decode("utf-8", "replace")
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        with fake._lock:
            fake.requests.append(
                RecordedRequest(
                    self.command,
                    parts.path,
                    query,
                    {k.lower(): v for k, v in self.headers.items()},  # header names fold case
                    body,
                )
            )
        for listener in REQUEST_LISTENERS:
            listener(self.command, parts.path, query)
        fault = fake._take_fault(self.command, parts.path)
        if fault is not None and fault.delay_s and fake._closing.wait(fault.delay_s):
            return  # shutting down
        if fault is not None and fault.status:
            reasons = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}
            self._send_json(
                fault.status, status_body(fault.status, reasons.get(fault.status, "InternalError"), "injected fault")
            )
            return
        try:
            code, payload = fake.handle(self.command, parts.path, query, body, content_type)
        except _ApiError as exc:
            self._send_json(exc.body["code"], exc.body)
            return
        if isinstance(payload, str):
            self._send(code, payload.encode(), "text/plain")
        else:
            self._send_json(code, payload)

    def _send_json(self, code: int, payload: Any) -> None:
        self._send(code, json.dumps(payload).encode(), "application/json")

    def _send(self, code: int, data: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _dispatch


# -- a Job controller and kubelet that run the container for real ----------------------------
@dataclass
class Termination:
    """What the kubelet reported when a container ended (kept after the pod is gone)."""

    namespace: str
    pod: str
    job: str
    exit_code: int
    reason: str
    message: str
    sigterm_at: float | None  # time.time() of each signal it sent, None if not sent
    sigkill_at: float | None
    ended_at: float


@dataclass
class _Container:
    process: subprocess.Popen
    log_path: Path
    termination_path: Path
    fallback_to_logs: bool
    job: str = ""
    sigterm_at: float | None = None
    sigkill_at: float | None = None


class FakeKubelet:
    """The Job controller and one kubelet, on a background thread, with real processes.

    - Job controller: a Job that is not suspended, not finished and has no pod gets one
      (from its template); `spec.suspend=true` deletes its pods gracefully (done by the
      API fake's patch), and unsuspending creates a new pod. backoffLimit 0 is assumed: a
      failed pod fails the Job.
    - kubelet: a pod is "pulled" and its container's argv (`command` + `args`) runs as a
      local process in its own session, with the container's `env` and `workingDir`. Volume
      mounts are mapped onto directories: a PVC to `volumes[claimName]` (or
      `volumes[(namespace, claimName)]`) joined with the mount's `subPath`, an emptyDir to a
      directory of its own under `root`. Paths in argv, env values and workingDir that lie
      under a mountPath are rewritten to the mapped directory (where the scheduler mounts the
      volume at the same path as the pods, the mapping is the identity). The container's
      terminationMessagePath becomes a file under `root`, passed as TERMINATION_LOG (the
      runner's override of /dev/termination-log).
    - A pod deleted with a grace period: SIGTERM to the process (PID 1 only, as the kubelet
      does), SIGKILL to its whole session when the grace (which a later delete may shorten)
      runs out; grace 0 is SIGKILL at once. When the process has ended the pod is removed.
    - A container that ends by itself: the pod's container status becomes `terminated` with
      the exit code (128 + signal for a signal death), reason Completed/Error and the
      termination message (the file's content, else with FallbackToLogsOnError and a
      failure the log's tail), the phase Succeeded/Failed, and the Job's counters and
      conditions follow.
    - `hold(job_name, reason, message)`: pods of that Job never start; they report the
      waiting reason (ErrImagePull, ImagePullBackOff, CreateContainerConfigError, ...) or,
      for reason "Unschedulable", a PodScheduled=False condition, as the scheduler does.

    Every container end is recorded in `terminations`. Not modelled: activeDeadlineSeconds,
    image pulls, resource limits, readOnly mounts (a local process can write anywhere).
    """

    def __init__(
        self,
        root: Path,
        *,
        volumes: dict[Any, Path] | None = None,
        extra_env: dict[str, str] | None = None,
        inherit_env: tuple[str, ...] = ("PATH", "LANG", "LC_ALL", "TZ"),
        interval_s: float = 0.02,
    ) -> None:
        """`extra_env`: added to every container's environment (a test hook, e.g. to slow a
        tiny training down); `inherit_env`: host variables an image would carry anyway."""
        self.root = Path(root)
        self.volumes = dict(volumes or {})
        self.extra_env = dict(extra_env or {})
        self.inherit_env = inherit_env
        self.interval_s = interval_s
        self.terminations: list[Termination] = []
        self.errors: list[str] = []  # the fake's own failures; tests may assert there are none
        self._failed_to_start: set[tuple[str, str]] = set()
        self.pods_created: list[tuple[float, str, str]] = []  # (time.time(), namespace, pod)
        self._held: dict[str, tuple[str, str]] = {}
        self._containers: dict[tuple[str, str], _Container] = {}
        self._fake: FakeKubernetes | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # -- control ----------------------------------------------------------------------------
    def attach(self, fake: FakeKubernetes) -> None:
        self._fake = fake
        self._thread = threading.Thread(target=self._loop, name="fake-kubelet", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for container in self._containers.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(container.process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                container.process.wait(timeout=5)

    def hold(self, job_name: str, reason: str, message: str = "") -> None:
        """Pods of `job_name` ("*": of every Job) stay Pending with this waiting reason (or
        Unschedulable) until `release`."""
        self._held[job_name] = (reason, message)

    def release(self, job_name: str) -> None:
        self._held.pop(job_name, None)

    def running(self, namespace: str, pod: str) -> bool:
        container = self._containers.get((namespace, pod))
        return container is not None and container.process.poll() is None

    def signals(self) -> dict[tuple[str, str], tuple[float | None, float | None]]:
        """Live containers by (namespace, pod): when SIGTERM and SIGKILL were sent (or None)."""
        return {key: (c.sigterm_at, c.sigkill_at) for key, c in list(self._containers.items())}

    def processes(self) -> dict[tuple[str, str], int]:
        """Live container processes by (namespace, pod): their pids."""
        return {key: c.process.pid for key, c in list(self._containers.items()) if c.process.poll() is None}

    # -- the loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopping.wait(self.interval_s):
            fake = self._fake
            assert fake is not None
            try:
                with fake._lock:
                    self._control_jobs(fake)
                    self._run_pods(fake)
            except Exception as error:  # a broken fake must not hang the test: keep going, say so
                self.errors.append(f"{type(error).__name__}: {error}")
                if len(self.errors) > 100:
                    raise

    def _control_jobs(self, fake: FakeKubernetes) -> None:
        for (namespace, name), job in list(fake.store.jobs.items()):
            if job["spec"].get("suspend"):
                continue
            conditions = {c["type"] for c in job["status"].get("conditions", []) if c.get("status") == "True"}
            if conditions & {"Complete", "Failed"} or job["status"].get("failed") or job["status"].get("succeeded"):
                continue
            if any(
                p["metadata"]["labels"].get("batch.kubernetes.io/job-name") == name
                for (ns, _), p in fake.store.pods.items()
                if ns == namespace
            ):
                continue
            pod = fake.add_pod(namespace, name, phase="Pending")
            self.pods_created.append((time.time(), namespace, pod))

    def _run_pods(self, fake: FakeKubernetes) -> None:
        for key, container in list(self._containers.items()):
            if key not in fake.store.pods:  # force-deleted (grace 0): the object went first
                if container.sigkill_at is None:
                    container.sigkill_at = time.time()
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(container.process.pid, signal.SIGKILL)
                code = container.process.poll()
                if code is not None:
                    pod = {"metadata": {"labels": {"batch.kubernetes.io/job-name": container.job}}}
                    self._finish(fake, key, pod, container, code, deleting=True)
        for key, pod in list(fake.store.pods.items()):
            container = self._containers.get(key)
            deleting = bool(pod["metadata"].get("deletionTimestamp"))
            if container is None:
                if deleting:  # nothing started: nothing to stop
                    fake._remove_pod(key)
                elif pod["status"].get("phase") == "Pending":
                    self._start_or_hold(fake, key, pod)
                continue
            code = container.process.poll()
            if code is None:
                if deleting:
                    self._signal(container, pod)
                else:
                    self._refresh_log(fake, key, container)
                continue
            self._finish(fake, key, pod, container, code, deleting)

    def _start_or_hold(self, fake: FakeKubernetes, key: tuple[str, str], pod: dict) -> None:
        job_name = pod["metadata"]["labels"].get("batch.kubernetes.io/job-name", "")
        held = self._held.get(job_name, self._held.get("*"))
        if held is not None:
            reason, message = held
            if reason == "Unschedulable":
                if not pod["status"].get("conditions"):
                    fake.set_pod_unschedulable(key[0], key[1], message)
            else:
                waiting = (pod["status"].get("containerStatuses") or [{}])[0].get("state", {}).get("waiting")
                if waiting != {"reason": reason, "message": message}:
                    fake.set_pod_waiting(key[0], key[1], reason, message)
            return
        if key in self._failed_to_start:
            return
        if pod["status"].get("conditions") or pod["status"].get("containerStatuses"):
            pod["status"] = {"phase": "Pending"}  # released: schedule and pull now
        try:
            self._containers[key] = self._spawn(key, pod)
        except (OSError, RuntimeError) as error:  # as the kubelet says when the runtime cannot start it
            self._failed_to_start.add(key)
            fake.set_pod_waiting(key[0], key[1], "CreateContainerError", str(error))
            return
        fake._set_container(pod, {"running": {"startedAt": _now()}}, ready=True)
        pod["status"]["phase"] = "Running"

    def _mapped_dirs(self, namespace: str, pod: dict) -> list[tuple[str, Path]]:
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        pod_root = self.root / "pods" / pod["metadata"]["uid"]
        mapped = []
        for mount in pod["spec"]["containers"][0].get("volumeMounts", []):
            volume = volumes[mount["name"]]
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                base = self.volumes.get((namespace, claim), self.volumes.get(claim))
                if base is None:
                    raise RuntimeError(f"no directory for PVC {namespace}/{claim}")
                subpath = mount.get("subPath", "")
                if subpath.startswith("/") or ".." in Path(subpath).parts:
                    raise RuntimeError(f"bad subPath {subpath!r}")
                host = Path(base) / subpath
            else:  # emptyDir and anything else: a directory of the pod's own
                host = pod_root / "volumes" / mount["name"]
            host.mkdir(parents=True, exist_ok=True)
            mapped.append((mount["mountPath"].rstrip("/") or "/", host))
        return sorted(mapped, key=lambda item: len(item[0]), reverse=True)

    @staticmethod
    def _map(value: str, mapped: list[tuple[str, Path]]) -> str:
        for mount_path, host in mapped:
            if value == mount_path:
                return str(host)
            if value.startswith(mount_path + "/"):
                return str(host) + value[len(mount_path) :]
        return value

    def _spawn(self, key: tuple[str, str], pod: dict) -> _Container:
        container = pod["spec"]["containers"][0]
        mapped = self._mapped_dirs(key[0], pod)
        pod_root = self.root / "pods" / pod["metadata"]["uid"]
        pod_root.mkdir(parents=True, exist_ok=True)
        termination_path = pod_root / "termination-log"
        termination_path.write_text("")
        log_path = pod_root / "container.log"
        env = {name: os.environ[name] for name in self.inherit_env if name in os.environ}
        env.update({item["name"]: self._map(item.get("value", ""), mapped) for item in container.get("env", [])})
        env.update(self.extra_env)
        env["TERMINATION_LOG"] = str(termination_path)
        argv = [self._map(arg, mapped) for arg in [*container.get("command", []), *container.get("args", [])]]
        # No workingDir: the image's, here a directory of the pod's own (a host path: not mapped).
        workdir = self._map(container["workingDir"], mapped) if container.get("workingDir") else str(pod_root)
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                argv, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return _Container(
            process=process, log_path=log_path, termination_path=termination_path,
            fallback_to_logs=container.get("terminationMessagePolicy") == "FallbackToLogsOnError",
            job=pod["metadata"]["labels"].get("batch.kubernetes.io/job-name", ""),
        )

    def _signal(self, container: _Container, pod: dict) -> None:
        now = time.time()
        grace = int(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
        if container.sigterm_at is None:
            container.sigterm_at = now
            if grace > 0:
                with contextlib.suppress(ProcessLookupError):
                    container.process.send_signal(signal.SIGTERM)  # PID 1 only
                return
        if container.sigkill_at is None and now >= container.sigterm_at + grace:
            container.sigkill_at = now
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(container.process.pid, signal.SIGKILL)  # the whole container

    def _refresh_log(self, fake: FakeKubernetes, key: tuple[str, str], container: _Container) -> None:
        with contextlib.suppress(OSError):
            fake.store.logs[key] = container.log_path.read_text("utf-8", "replace")

    def _finish(
        self, fake: FakeKubernetes, key: tuple[str, str], pod: dict, container: _Container, code: int, deleting: bool
    ) -> None:
        del self._containers[key]
        with contextlib.suppress(subprocess.TimeoutExpired):
            container.process.wait(timeout=1)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(container.process.pid, signal.SIGKILL)  # the container's leftovers go with it
        self._refresh_log(fake, key, container)
        exit_code = code if code >= 0 else 128 - code
        message = container.termination_path.read_text("utf-8", "replace")[:4096].strip()
        if not message and container.fallback_to_logs and exit_code != 0:
            tail = fake.store.logs.get(key, "").splitlines()[-80:]
            message = "\n".join(tail)[-2048:]
        reason = "Completed" if exit_code == 0 else "Error"
        self.terminations.append(
            Termination(
                namespace=key[0], pod=key[1], job=pod["metadata"]["labels"].get("batch.kubernetes.io/job-name", ""),
                exit_code=exit_code, reason=reason, message=message, sigterm_at=container.sigterm_at,
                sigkill_at=container.sigkill_at, ended_at=time.time(),
            )
        )
        if deleting:  # the status is written, then the object goes (grace over)
            if key in fake.store.pods:
                fake._remove_pod(key)
        else:
            fake.terminate_pod(key[0], key[1], exit_code, reason=reason, message=message)
