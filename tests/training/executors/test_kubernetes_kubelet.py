"""The Kubernetes executor against the fake API server with its fake kubelet: the Job's
container really runs (a stand-in program), a stop becomes SIGTERM then SIGKILL after the
grace, the exit code and termination message come back in the pod status, suspension is
honoured, and a pod stuck in an image pull error or Unschedulable fails its run after the
patience with a sentence saying why."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from kubernetes import client

from tests.fakes.k8s_api import FakeKubelet, FakeKubernetes
from tests.training.executors.conftest import make_spec, wait_until
from training.executors.base import RunState
from training.executors.kubernetes import KubernetesConfig, KubernetesExecutor, build_job_manifest

NS = "gpubook-vision"
JOB = "gpubook-run-42"
OUT = "/runs/vision/job-7"
CONFIG = KubernetesConfig(image_allowlist=("registry.example.com/training/",), request_timeout_s=5.0)
# A stand-in trainer: records where it runs, and on SIGTERM writes a termination message and
# exits 75 like the runner ("ignore": it does not stop, so only SIGKILL ends it).
PROGRAM = textwrap.dedent(
    """
    import json, os, pathlib, signal, sys, time
    out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
    mode = sys.argv[2]
    def ended(status, code):
        pathlib.Path(os.environ["TERMINATION_LOG"]).write_text(json.dumps({"status": status, "exit_code": code}))
        sys.exit(code)
    def on_term(*_):
        (out / "sigterm").write_text(str(time.time()))
        if mode != "ignore":
            ended("checkpointed", 75)
    signal.signal(signal.SIGTERM, on_term)
    (out / "started").write_text(json.dumps({"cwd": os.getcwd(), "home": os.environ["HOME"], "argv": sys.argv}))
    if mode.startswith("exit"):
        ended("succeeded" if mode == "exit0" else "failed", int(mode[4:]))
    while True:
        time.sleep(0.01)
    """
)


@pytest.fixture
def cluster(tmp_path):
    runs = tmp_path / "pvc-runs"
    (runs / "vision").mkdir(parents=True)
    (runs / "vision" / "program.py").write_text(PROGRAM)
    kubelet = FakeKubelet(tmp_path / "kubelet", volumes={"gpubook-runs": runs, "gpubook-data": tmp_path / "pvc-data"})
    with FakeKubernetes(kubelet=kubelet) as fake:
        yield fake, runs / "vision" / "job-7"


def spec_for(mode: str, **fields):
    now = datetime.now(UTC)
    return make_spec(
        argv=[sys.executable, "/runs/vision/program.py", OUT, mode], output_dir=OUT, workdir="/runs/vision",
        must_end_by=now + timedelta(hours=1), **fields,
    )


def executor_for(fake, clock=None):
    kwargs = {"clock": clock} if clock else {}
    return KubernetesExecutor(CONFIG, client_configuration=fake.client_configuration(), **kwargs)


def test_the_container_runs_with_its_mounts_env_and_working_directory(cluster):
    fake, out = cluster
    executor = executor_for(fake)
    executor.start(spec_for("run"))
    started = json.loads(wait_until(lambda: (out / "started").is_file() and (out / "started").read_text()))
    # /runs/vision is the team's subPath of the runs PVC; /tmp is the pod's own emptyDir.
    assert started["cwd"] == str(out.parent)
    assert started["argv"][1] == OUT.replace("/runs/vision", str(out.parent))
    assert Path(started["home"]).parts[-2:] == ("volumes", "tmp")
    assert wait_until(lambda: executor.observe()[0].reason == "Running")


def test_stop_is_sigterm_then_the_runner_exits_75_with_its_message(cluster):
    fake, out = cluster
    executor = executor_for(fake)
    handle = executor.start(spec_for("run"))
    wait_until(lambda: (out / "started").is_file())
    executor.stop(handle, 30)
    wait_until(lambda: fake.kubelet.terminations)
    [ended] = fake.kubelet.terminations
    assert (ended.exit_code, ended.sigkill_at) == (75, None)
    assert json.loads(ended.message) == {"status": "checkpointed", "exit_code": 75}
    assert (out / "sigterm").is_file()
    wait_until(lambda: not fake.pods_of(NS, JOB))  # the deleted pod goes once its process ended
    observed = executor.observe()[0]
    assert (observed.state, observed.reason) == (RunState.STOPPED, "Suspended")
    assert not fake.pods_of(NS, JOB)  # suspended: the controller starts no new pod


def test_a_process_ignoring_sigterm_is_killed_when_the_grace_runs_out(cluster):
    fake, out = cluster
    executor = executor_for(fake)
    handle = executor.start(spec_for("ignore"))
    wait_until(lambda: (out / "started").is_file())
    executor.stop(handle, 1)
    wait_until(lambda: fake.kubelet.terminations, timeout=10)
    [ended] = fake.kubelet.terminations
    assert ended.exit_code == 137 and ended.sigterm_at is not None
    assert 1.0 <= ended.sigkill_at - ended.sigterm_at < 2.0
    assert (out / "sigterm").is_file()


def test_kill_is_sigkill_at_once(cluster):
    fake, out = cluster
    executor = executor_for(fake)
    handle = executor.start(spec_for("ignore"))
    wait_until(lambda: (out / "started").is_file())
    asked = time.time()
    executor.kill(handle)
    wait_until(lambda: fake.kubelet.terminations)
    [ended] = fake.kubelet.terminations
    # It ignores SIGTERM and the pod's grace is 120 s: only the grace-0 delete ends it this soon.
    assert ended.exit_code == 137 and ended.sigkill_at - asked < 1.0


@pytest.mark.parametrize(("mode", "state", "reason"), [("exit0", RunState.SUCCEEDED, "Completed"),
                                                       ("exit1", RunState.FAILED, "Error")])
def test_an_ended_container_reports_its_exit_code_and_message(cluster, mode, state, reason):
    fake, _ = cluster
    executor = executor_for(fake)
    executor.start(spec_for(mode))
    observed = wait_until(lambda: next((o for o in executor.observe() if o.state.ended), None))
    assert (observed.state, observed.reason, observed.exit_code) == (state, reason, int(mode[4:]))
    assert json.loads(observed.detail)["exit_code"] == int(mode[4:])
    job = fake.job(NS, JOB)
    assert job["status"].get("succeeded" if mode == "exit0" else "failed") == 1


def test_a_suspended_job_gets_no_pod_until_resumed(cluster):
    fake, out = cluster
    manifest = build_job_manifest(spec_for("run"), CONFIG, datetime.now(UTC))
    manifest["spec"]["suspend"] = True
    batch = client.BatchV1Api(client.ApiClient(fake.client_configuration()))
    batch.create_namespaced_job(NS, manifest)
    with pytest.raises(AssertionError):
        wait_until(lambda: fake.pods_of(NS, JOB), timeout=0.5)
    batch.patch_namespaced_job(JOB, NS, {"spec": {"suspend": False}})
    wait_until(lambda: (out / "started").is_file())


@pytest.mark.parametrize(
    ("reason", "message", "sentence"),
    [
        ("ImagePullBackOff", 'Back-off pulling image "registry.example.com/training/yolo:v8n-cu118"',
         "image registry.example.com/training/yolo:v8n-cu118 could not be pulled: Back-off pulling image"),
        ("ErrImagePull", "manifest unknown", "image registry.example.com/training/yolo:v8n-cu118 could not be pulled"),
        ("CreateContainerConfigError", 'secret "wandb" not found', "the container could not be configured"),
        ("Unschedulable", "0/3 nodes are available: 3 Insufficient nvidia.com/gpu", "no node can take the pod: 0/3"),
    ],
)
def test_a_pod_stuck_past_the_patience_fails_the_run_in_words(cluster, reason, message, sentence):
    fake, _ = cluster
    clock = [datetime.now(UTC)]
    executor = executor_for(fake, clock=lambda: clock[0])
    fake.kubelet.hold(JOB, reason, message)
    handle = executor.start(spec_for("run"))
    observed = wait_until(lambda: next((o for o in executor.observe() if o.reason == reason), None))
    assert observed.state is RunState.RUNNING  # within the patience: it may still come up
    clock[0] += timedelta(seconds=CONFIG.stuck_patience_s - 5)
    assert executor.observe()[0].state is RunState.RUNNING
    clock[0] += timedelta(seconds=10)
    observed = executor.observe()[0]
    assert observed.state is RunState.FAILED and observed.reason == reason
    assert observed.detail.startswith(sentence) and message in observed.detail
    executor.cleanup(handle)
    assert fake.job(NS, JOB) is None and not fake.pods_of(NS, JOB)
    assert not fake.kubelet.terminations  # nothing ever ran


def test_a_container_that_cannot_start_says_so_in_its_status(cluster):
    fake, _ = cluster
    executor = executor_for(fake)
    spec = make_spec(
        argv=["/runs/vision/no-such-program"], output_dir=OUT, must_end_by=datetime.now(UTC) + timedelta(hours=1)
    )
    executor.start(spec)
    observed = wait_until(lambda: next((o for o in executor.observe() if o.reason == "CreateContainerError"), None))
    assert "no-such-program" in observed.detail and not fake.kubelet.terminations
    assert not fake.kubelet.errors
