"""The executor's handle is stored on the run and used by everyone who talks to the executor.

Driven through reconcile with the real Kubernetes executor and the real `kubernetes` client
against the wire-level fake API server: the stop, kill and log requests reconcile (and the
run log endpoint) make must address the Job in the namespace it was created in. With a
hand-built handle (no namespace) every one of them failed."""

import datetime as dt
import sys

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from gpus.models import Gpu, Node
from reservations.models import Membership, Team
from reservations.services import reservation_create
from tests.fakes.k8s_api import FakeKubernetes
from tests.security.tokens import token_for
from training import api as training_api
from training.executors.kubernetes import KubernetesConfig, KubernetesExecutor
from training.models import Run, TrainingImage
from training.reconcile import reconcile
from training.run_state import run_handle
from training.services import job_submit

UTC = dt.UTC
H = dt.timedelta(hours=1)
GRACE = 60
NAMESPACE = "team-vision-ns"  # not the default template: only the executor knows it
JOB_NAME = "gpubook-run-{}"


@pytest.fixture
def k8s_world(db, tmp_path, settings):
    settings.GPUBOOK_RUNS_DIR = tmp_path / "runs"
    settings.GPUBOOK_STOP_GRACE_SECONDS = GRACE
    settings.GPUBOOK_NO_SHOW_MINUTES = 15
    TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")
    node = Node.objects.create(name="gpu-node-1")
    gpu = Gpu.objects.create(node=node, index=0, model_name="A100", memory_mib=81920)
    team = Team.objects.create(name="vision", slug="vision", monthly_gpu_hours=1000)
    user = get_user_model().objects.create_user(username="alice")
    Membership.objects.create(team=team, user=user)
    start = dt.datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + dt.timedelta(days=2)
    with FakeKubernetes() as fake:
        config = KubernetesConfig(
            image_allowlist=("yolo:v8n-cu118",), namespace_template="team-{team}-ns",
            runs_mount_path=str(settings.GPUBOOK_RUNS_DIR), request_timeout_s=2.0, retries=0,
        )
        executor = KubernetesExecutor(config, client_configuration=fake.client_configuration())
        yield {"fake": fake, "executor": executor, "gpu": gpu, "team": team, "user": user, "start": start}


def _requests(fake, method, pattern):
    return [request.path for request in fake.requests_for(method, pattern)]


@pytest.mark.django_db
def test_reconcile_stop_kill_and_log_carry_the_namespace(k8s_world, monkeypatch):
    fake, executor, start = k8s_world["fake"], k8s_world["executor"], k8s_world["start"]
    reservation = reservation_create(
        user=k8s_world["user"], team=k8s_world["team"], gpu_ids=[k8s_world["gpu"].pk], start=start, end=start + H,
        now=start - 3 * H,
    )
    job_submit(user=k8s_world["user"], now=start - 2 * H, reservation_id=reservation.pk, document={
        "task_name": "job", "image": "yolo:v8n-cu118", "team": "vision", "resources": {"gpu": 1},
        "command": [sys.executable, "-c", "print('hi')"], "checkpointable": True,
    })

    report = reconcile(now=start, executor=executor)
    (run,) = Run.objects.all()
    assert report.started == [run.pk] and not report.errors
    handle = run_handle(run)
    assert handle is not None and handle.namespace == NAMESPACE and handle.uid  # stored as start() returned it
    assert fake.job(NAMESPACE, JOB_NAME.format(run.pk)) is not None
    pod = fake.add_pod(NAMESPACE, JOB_NAME.format(run.pk))
    fake.set_log(NAMESPACE, pod, "epoch 1/3\n")

    # The run log endpoint reads the same stored handle.
    monkeypatch.setattr(training_api, "executor_from_settings", lambda: executor)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_for(k8s_world['user'])}")
    response = client.get(f"/api/v1/runs/{run.pk}/log/")
    assert response.status_code == 200 and response.json()["log"] == "epoch 1/3\n"
    assert _requests(fake, "GET", "/log$") == [f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}/log"]

    report = reconcile(now=start + H - dt.timedelta(seconds=GRACE), executor=executor)
    assert report.stopped == [run.pk] and not report.errors, report.errors
    job_path = f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/{JOB_NAME.format(run.pk)}"
    assert _requests(fake, "PATCH", "/jobs/") == [job_path]  # suspend
    assert _requests(fake, "DELETE", "/pods/") == [f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}"]
    assert fake.requests_for("DELETE", "/pods/")[0].query.get("gracePeriodSeconds") == str(GRACE)

    fake.add_pod(NAMESPACE, JOB_NAME.format(run.pk))  # a pod that outlives its grace
    report = reconcile(now=start + H, executor=executor)
    assert report.killed == [run.pk] and not report.errors, report.errors
    patches = fake.requests_for("PATCH", "/jobs/")
    assert [request.path for request in patches] == [job_path, job_path]  # the stop (once), then the kill
    assert patches[-1].body["metadata"]["annotations"]  # the kill's suspend carries the killed mark
    kill_deletes = fake.requests_for("DELETE", "/pods/")[1:]
    assert kill_deletes and all(f"/namespaces/{NAMESPACE}/" in request.path for request in kill_deletes)
    assert {request.query.get("gracePeriodSeconds") for request in kill_deletes} == {"0"}


@pytest.mark.django_db
def test_no_code_builds_a_handle_by_hand():
    """Only the executors (which know where they put a run) construct a Handle."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2] / "training"
    builders = sorted(
        str(path.relative_to(root)) for path in root.rglob("*.py")
        if re.search(r"\bHandle\(", path.read_text()) and "executors" not in path.parts
    )
    assert builders == []
