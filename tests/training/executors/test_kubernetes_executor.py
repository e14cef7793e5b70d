"""The Kubernetes executor driving the real `kubernetes` client against the loopback fake.

Assertions are on the wire: which requests were made, with which query parameters, bodies
and content types, and what the executor made of the answers."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from kubernetes import client

from tests.fakes.k8s_api import FakeKubernetes
from tests.training.executors.conftest import NOW, make_spec
from training.executors.base import (
    ExecutorError,
    ExecutorUnavailable,
    Handle,
    ImageNotAllowed,
    RunSpecMismatch,
    RunState,
)
from training.executors.kubernetes import (
    KubernetesConfig,
    KubernetesExecutor,
    build_job_manifest,
    build_manifests,
)

NS = "gpubook-vision"
JOB = "gpubook-run-42"
JOBS = rf"^/apis/batch/v1/namespaces/{NS}/jobs"
UUIDS = ("GPU-0a1b2c3d-1111-2222-3333-444455556666", "GPU-9f8e7d6c-1111-2222-3333-444455556666")
CONFIG = KubernetesConfig(
    image_allowlist=("registry.example.com/training/",),
    request_timeout_s=2.0,
    retries=2,
    retry_backoff_s=0.5,
)


class RecordingSleep:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def make_executor(fake: FakeKubernetes, config: KubernetesConfig = CONFIG, sleep=None):
    return KubernetesExecutor(config, client_configuration=fake.client_configuration(), sleep=sleep or RecordingSleep())


def observed_one(executor: KubernetesExecutor):
    [observed] = executor.observe()
    return observed


@pytest.fixture
def executor(fake_k8s):
    return make_executor(fake_k8s)


@pytest.fixture
def started(fake_k8s, executor):
    return executor.start(make_spec(), now=NOW)


# -- create, 409, get --------------------------------------------------------------------------
def test_start_creates_the_job_exactly_as_built(fake_k8s, executor):
    spec = make_spec()
    handle = executor.start(spec, now=NOW)
    [create] = fake_k8s.requests_for("POST", JOBS)
    assert create.body == build_job_manifest(spec, CONFIG, NOW)
    assert create.headers["authorization"] == "Bearer fake-token"
    # v37 sends creates without Content-Type; the apiserver then takes its first supported
    # media type, JSON (apimachinery NegotiateInputSerializerForMediaType). The fake does too.
    assert create.headers.get("content-type", "application/json") == "application/json"
    stored = fake_k8s.job(NS, JOB)
    assert handle == Handle(run_id=42, name=JOB, executor="kubernetes", namespace=NS, uid=stored["metadata"]["uid"])


def test_fake_server_side_validation_accepts_every_start():
    with FakeKubernetes(validate_version="1.34") as fake:
        executor = make_executor(fake)
        executor.start(make_spec(), now=NOW)
        executor.start(make_spec(run_id=43, gpu_indices=(), cpu="2", memory="4Gi"), now=NOW)
        assert len(fake.store.jobs) == 2


def test_a_repeated_start_reads_the_existing_job(fake_k8s, executor):
    spec = make_spec()
    first = executor.start(spec, now=NOW)
    later = NOW.replace(minute=30)  # a retry on a later tick: another deadline, same spec
    assert make_executor(fake_k8s).start(spec, now=later) == first
    assert [r.method for r in fake_k8s.requests] == ["POST", "POST", "GET"]
    assert fake_k8s.requests[2].path == f"/apis/batch/v1/namespaces/{NS}/jobs/{JOB}"
    assert len(fake_k8s.store.jobs) == 1
    assert fake_k8s.job(NS, JOB)["spec"]["activeDeadlineSeconds"] == 7200  # the first one's


def test_409_returns_a_real_status_that_the_client_parses(fake_k8s):
    api = client.BatchV1Api(client.ApiClient(fake_k8s.client_configuration()))
    body = build_job_manifest(make_spec(), CONFIG, NOW)
    api.create_namespaced_job(NS, body)
    with pytest.raises(client.ApiException) as caught:
        api.create_namespaced_job(NS, body)
    assert caught.value.status == 409
    assert '"reason": "AlreadyExists"' in caught.value.body


def test_a_clash_with_another_spec_is_refused(fake_k8s, executor):
    executor.start(make_spec(), now=NOW)
    with pytest.raises(RunSpecMismatch):
        executor.start(make_spec(argv=["python", "other.py"]), now=NOW)


def test_after_must_end_by_start_only_finds_an_existing_job(fake_k8s, executor):
    spec = make_spec()
    with pytest.raises(ValueError, match="has passed"):
        executor.start(spec, now=spec.must_end_by)
    assert fake_k8s.requests_for("POST") == []
    handle = executor.start(spec, now=NOW)
    assert executor.start(spec, now=spec.must_end_by) == handle


def test_an_image_outside_the_allowlist_never_reaches_the_api(fake_k8s, executor):
    with pytest.raises(ImageNotAllowed):
        executor.start(make_spec(image="docker.io/evil/miner:latest"), now=NOW)
    assert fake_k8s.requests == []


# -- observe ---------------------------------------------------------------------------------
def test_observe_lists_by_label_in_the_teams_namespaces(fake_k8s, executor, started):
    other_instance = make_executor(fake_k8s, replace(CONFIG, instance="staging"))
    other_instance.start(make_spec(run_id=43), now=NOW)
    fresh = make_executor(fake_k8s)  # a restarted scheduler: knows namespaces only via teams
    assert fresh.observe() == []
    fake_k8s.requests.clear()
    [observed] = fresh.observe(teams=["vision"])
    assert observed.run_id == 42 and observed.handle == started
    lists = fake_k8s.requests_for("GET")
    assert [r.path for r in lists] == [f"/apis/batch/v1/namespaces/{NS}/jobs", f"/api/v1/namespaces/{NS}/pods"]
    for request in lists:
        assert request.query["labelSelector"] == ("app.kubernetes.io/managed-by=gpubook,gpubook/instance=default")


def test_observe_all_namespaces(fake_k8s, started):
    executor = make_executor(fake_k8s, replace(CONFIG, all_namespaces=True))
    fake_k8s.requests.clear()
    assert [o.run_id for o in executor.observe()] == [42]
    assert [r.path for r in fake_k8s.requests] == ["/apis/batch/v1/jobs", "/api/v1/pods"]


def test_observe_watch_namespaces_from_config(fake_k8s, started):
    executor = make_executor(fake_k8s, replace(CONFIG, watch_namespaces=(NS,)))
    assert [o.run_id for o in executor.observe()] == [42]


def test_pending_states_carry_the_reason(fake_k8s, executor, started):
    observed = observed_one(executor)
    assert (observed.state, observed.reason) == (RunState.RUNNING, "Pending")
    pod = fake_k8s.add_pod(NS, JOB, phase="Pending")
    fake_k8s.set_pod_unschedulable(NS, pod, "0/3 nodes are available: 1 Insufficient nvidia.com/gpu")
    observed = observed_one(executor)
    assert (observed.state, observed.reason) == (RunState.RUNNING, "Unschedulable")
    assert "Insufficient nvidia.com/gpu" in observed.detail
    fake_k8s.set_pod_waiting(NS, pod, "ImagePullBackOff", "Back-off pulling image")
    observed = observed_one(executor)
    assert (observed.state, observed.reason, observed.detail) == (
        RunState.RUNNING,
        "ImagePullBackOff",
        "Back-off pulling image",
    )


@pytest.mark.parametrize(
    ("exit_code", "reason", "state"),
    [
        (0, None, RunState.SUCCEEDED),
        (75, None, RunState.CHECKPOINTED),
        (1, None, RunState.FAILED),
        (137, "OOMKilled", RunState.FAILED),
    ],
)
def test_pod_exit_codes_become_states(fake_k8s, executor, started, exit_code, reason, state):
    pod = fake_k8s.add_pod(NS, JOB)
    assert observed_one(executor).reason == "Running"
    fake_k8s.terminate_pod(NS, pod, exit_code, reason=reason, message="checkpoint=/runs/last.pt epoch=3")
    observed = observed_one(executor)
    assert (observed.state, observed.exit_code) == (state, exit_code)
    assert observed.reason == (reason or ("Completed" if exit_code == 0 else "Error"))
    assert observed.detail == "checkpoint=/runs/last.pt epoch=3"


def test_deadline_exceeded_without_a_pod_is_a_failure(fake_k8s, executor, started):
    fake_k8s.set_job_condition(NS, JOB, "Failed", "DeadlineExceeded", "Job was active longer than specified deadline")
    observed = observed_one(executor)
    assert (observed.state, observed.exit_code, observed.reason) == (RunState.FAILED, None, "DeadlineExceeded")


def test_a_live_pod_of_a_failing_job_still_holds_its_gpus(fake_k8s, executor, started):
    fake_k8s.add_pod(NS, JOB)
    fake_k8s.set_job_condition(NS, JOB, "FailureTarget", "DeadlineExceeded")
    observed = observed_one(executor)
    assert (observed.state, observed.reason) == (RunState.RUNNING, "Terminating")


# -- stop, kill, cleanup ----------------------------------------------------------------------
def test_stop_suspends_and_deletes_the_pod_with_the_grace(fake_k8s, executor, started):
    pod = fake_k8s.add_pod(NS, JOB)
    fake_k8s.requests.clear()
    executor.stop(started, grace_s=90)
    [patch] = fake_k8s.requests_for("PATCH")
    assert patch.path == f"/apis/batch/v1/namespaces/{NS}/jobs/{JOB}"
    assert patch.body == {"spec": {"suspend": True}}
    assert patch.headers["content-type"] == "application/strategic-merge-patch+json"
    [delete] = fake_k8s.requests_for("DELETE")
    assert delete.path == f"/api/v1/namespaces/{NS}/pods/{pod}"
    assert delete.query["gracePeriodSeconds"] == "90"
    [terminating] = fake_k8s.pods_of(NS, JOB)
    assert terminating["metadata"]["deletionGracePeriodSeconds"] == 90
    observed = observed_one(executor)
    assert (observed.state, observed.reason) == (RunState.RUNNING, "Terminating")

    # The trainer checkpoints and exits 75 while its pod is terminating...
    fake_k8s.terminate_pod(NS, pod, 75, message="checkpoint=/runs/last.pt")
    observed = observed_one(executor)
    assert (observed.state, observed.exit_code) == (RunState.CHECKPOINTED, 75)
    # ...and once kubelet removes the pod, the suspended Job is all that is left.
    fake_k8s.complete_deletions()
    observed = observed_one(executor)
    assert (observed.state, observed.exit_code, observed.reason) == (RunState.STOPPED, None, "Suspended")


def test_kill_deletes_pods_with_no_grace(fake_k8s, executor, started):
    pod = fake_k8s.add_pod(NS, JOB)
    fake_k8s.requests.clear()
    executor.kill(started)
    [patch] = fake_k8s.requests_for("PATCH")
    assert patch.body == {"spec": {"suspend": True}, "metadata": {"annotations": {"gpubook/killed": "true"}}}
    [delete] = fake_k8s.requests_for("DELETE")
    assert (delete.path, delete.query["gracePeriodSeconds"]) == (f"/api/v1/namespaces/{NS}/pods/{pod}", "0")
    assert fake_k8s.pods_of(NS, JOB) == []
    observed = observed_one(executor)
    assert (observed.state, observed.reason) == (RunState.STOPPED, "Killed")
    executor.kill(started)  # idempotent


def test_kill_reaches_pods_whose_job_is_gone(fake_k8s, executor, started):
    pod = fake_k8s.add_pod(NS, JOB)
    api = client.BatchV1Api(client.ApiClient(fake_k8s.client_configuration()))
    api.delete_namespaced_job(JOB, NS)  # someone deleted it with the default: orphan
    observed = observed_one(executor)
    assert (observed.state, observed.reason) == (RunState.RUNNING, "Orphaned")
    executor.kill(observed.handle)
    assert fake_k8s.store.pods.get((NS, pod)) is None
    assert executor.observe() == []


def test_cleanup_deletes_with_background_propagation(fake_k8s, executor, started):
    fake_k8s.terminate_pod(NS, fake_k8s.add_pod(NS, JOB), 0)
    fake_k8s.requests.clear()
    executor.cleanup(started)
    [delete] = fake_k8s.requests_for("DELETE", "/jobs/")
    assert delete.path == f"/apis/batch/v1/namespaces/{NS}/jobs/{JOB}"
    assert delete.query["propagationPolicy"] == "Background"
    assert fake_k8s.job(NS, JOB) is None
    assert fake_k8s.pods_of(NS, JOB) == []
    assert executor.observe() == []
    executor.cleanup(started)  # 404s are fine


def test_the_default_delete_would_orphan_the_pod(fake_k8s, started):
    # Negative control for the test above: without propagationPolicy the fake, like the
    # real API for Jobs, leaves the pod running.
    fake_k8s.add_pod(NS, JOB)
    client.BatchV1Api(client.ApiClient(fake_k8s.client_configuration())).delete_namespaced_job(JOB, NS)
    [pod] = fake_k8s.pods_of(NS, JOB)
    assert pod["status"]["phase"] == "Running" and "deletionTimestamp" not in pod["metadata"]


def test_stop_and_kill_of_a_missing_job_are_no_ops(fake_k8s, executor):
    handle = Handle(run_id=5, name="gpubook-run-5", executor="kubernetes", namespace=NS)
    executor.stop(handle, 30)
    executor.kill(handle)
    executor.cleanup(handle)
    assert fake_k8s.store.jobs == {}


def test_a_handle_without_namespace_is_an_error(executor):
    with pytest.raises(ExecutorError, match="namespace"):
        executor.stop(Handle(run_id=5, name="gpubook-run-5", executor="kubernetes"), 30)


# -- logs --------------------------------------------------------------------------------------
def test_log_tail_reads_the_train_container_raw(fake_k8s, executor, started):
    assert executor.log_tail(started) == ""  # no pod yet
    pod = fake_k8s.add_pod(NS, JOB)
    fake_k8s.set_log(NS, pod, 'epoch 1\n{"epoch": 2, "mAP50": 0.5}\nepoch 3\n')
    assert executor.log_tail(started, lines=2) == '{"epoch": 2, "mAP50": 0.5}\nepoch 3\n'
    [request] = fake_k8s.requests_for("GET", r"/log$")
    assert request.query == {"container": "train", "tailLines": "2"}


# -- faults ------------------------------------------------------------------------------------
def test_a_transient_500_is_retried(fake_k8s):
    sleep = RecordingSleep()
    executor = make_executor(fake_k8s, sleep=sleep)
    fake_k8s.fail("POST", JOBS, status=500, times=1)
    handle = executor.start(make_spec(), now=NOW)
    assert handle.uid == fake_k8s.job(NS, JOB)["metadata"]["uid"]
    assert len(fake_k8s.requests_for("POST")) == 2
    assert sleep.calls == [0.5]


def test_persistent_500s_give_a_clear_error_after_bounded_retries(fake_k8s):
    sleep = RecordingSleep()
    executor = make_executor(fake_k8s, sleep=sleep)
    fake_k8s.fail("GET", JOBS, status=503, times=100)
    with pytest.raises(ExecutorUnavailable) as caught:
        executor.observe(teams=["vision"])
    message = str(caught.value)
    assert "list Jobs in gpubook-vision" in message
    assert "3 attempts" in message and "503" in message and "injected fault" in message
    assert len(fake_k8s.requests_for("GET")) == 3
    assert sleep.calls == [0.5, 1.0]


def test_429_is_retried_too(fake_k8s, executor):
    fake_k8s.fail("PATCH", JOBS, status=429, times=2)
    executor.start(make_spec(), now=NOW)
    executor.stop(executor.start(make_spec(), now=NOW), 30)
    assert len(fake_k8s.requests_for("PATCH")) == 3
    assert fake_k8s.job(NS, JOB)["spec"]["suspend"] is True


def test_a_client_error_is_not_retried(fake_k8s):
    sleep = RecordingSleep()
    executor = make_executor(fake_k8s, sleep=sleep)
    fake_k8s.fail("POST", JOBS, status=403, times=1)
    with pytest.raises(ExecutorError, match="403") as caught:
        executor.start(make_spec(), now=NOW)
    assert not isinstance(caught.value, ExecutorUnavailable)
    assert len(fake_k8s.requests_for("POST")) == 1 and sleep.calls == []


def test_timeouts_are_bounded(fake_k8s):
    config = replace(CONFIG, request_timeout_s=0.3, retries=1, retry_backoff_s=0.0)
    executor = make_executor(fake_k8s, config, sleep=time.sleep)
    fake_k8s.delay("GET", JOBS, seconds=30, times=10)
    started_at = time.monotonic()
    with pytest.raises(ExecutorUnavailable, match=r"2 attempts.*ReadTimeoutError"):
        executor.observe(teams=["vision"])
    assert time.monotonic() - started_at < 3.0  # 2 x 0.3 s, not 2 x 30 s


def test_a_slow_create_that_committed_is_found_by_the_retry(fake_k8s):
    # The apiserver creates the Job after the client gave up; the retry must not make a
    # second one (whichever request wins, the other gets 409 and reads the winner).
    config = replace(CONFIG, request_timeout_s=0.3, retries=2, retry_backoff_s=0.5)
    executor = make_executor(fake_k8s, config, sleep=time.sleep)
    fake_k8s.delay("POST", JOBS, seconds=0.6, times=1)
    handle = executor.start(make_spec(), now=NOW)
    assert len(fake_k8s.store.jobs) == 1
    assert handle.uid == fake_k8s.job(NS, JOB)["metadata"]["uid"]


def test_connection_refused_is_unavailable(fake_k8s):
    executor = make_executor(fake_k8s, replace(CONFIG, retries=0))
    fake_k8s.stop()
    with pytest.raises(ExecutorUnavailable, match="1 attempts"):
        executor.start(make_spec(), now=NOW)


# -- DRA -----------------------------------------------------------------------------------------
def test_dra_creates_the_claim_template_first_and_cleans_it_up(fake_k8s):
    config = replace(CONFIG, dra=True)
    executor = make_executor(fake_k8s, config)
    spec = make_spec(gpu_uuids=UUIDS)
    handle = executor.start(spec, now=NOW)
    assert executor.start(spec, now=NOW) == handle  # 409 on both objects is fine
    posts = fake_k8s.requests_for("POST")
    assert [p.path.rsplit("/", 1)[1] for p in posts] == [
        "resourceclaimtemplates",
        "jobs",
        "resourceclaimtemplates",
        "jobs",
    ]
    claim, job = build_manifests(spec, config, NOW)
    assert posts[0].body == claim and posts[1].body == job
    assert (NS, "gpubook-run-42-gpus") in fake_k8s.store.claim_templates
    executor.cleanup(handle)
    assert fake_k8s.store.claim_templates == {} and fake_k8s.store.jobs == {}
