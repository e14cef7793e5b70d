"""The preview is the launch: `k8s_manifest --run` prints exactly the Job reconcile created
for that run (issue #13 item 6), through the real Kubernetes executor on the wire-level fake."""

import datetime as dt
import io
import sys

import pytest
import yaml
from django.contrib.auth import get_user_model
from django.core.management import call_command

from gpus.models import Gpu, Node
from reservations.models import Membership, Team
from reservations.services import reservation_create
from tests.fakes.k8s_api import FakeKubernetes
from training.execution import kubernetes_config_from_settings
from training.executors.kubernetes import KubernetesExecutor
from training.models import Run, TrainingImage
from training.reconcile import reconcile
from training.services import job_submit

H = dt.timedelta(hours=1)


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["yolo", "command"])
def test_preview_manifest_is_the_launched_job(settings, tmp_path, kind):
    settings.GPUBOOK_RUNS_DIR = tmp_path / "runs"
    settings.GPUBOOK_DATA_ROOTS = [str(tmp_path / "data") + "/{team}"]
    TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")
    node = Node.objects.create(name="gpu-node-1")
    gpu = Gpu.objects.create(node=node, index=0, model_name="A100", memory_mib=81920)
    team = Team.objects.create(name="vision", slug="vision", monthly_gpu_hours=1000)
    user = get_user_model().objects.create_user(username="alice")
    Membership.objects.create(team=team, user=user)
    start = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0) + dt.timedelta(days=2)
    reservation = reservation_create(user=user, team=team, gpu_ids=[gpu.pk], start=start, end=start + H,
                                     now=start - 3 * H)
    task = ({"yolo": {"model": "yolov8n.yaml", "data": str(tmp_path / "data" / "vision" / "d.yaml"), "epochs": 3}}
            if kind == "yolo" else {"command": [sys.executable, "-c", "pass"]})
    job_submit(user=user, now=start - 2 * H, reservation_id=reservation.pk, document={
        "task_name": "job", "image": "yolo:v8n-cu118", "team": "vision", "resources": {"gpu": 1, "memory": "8Gi"},
        **task,
    })
    with FakeKubernetes() as fake:
        executor = KubernetesExecutor(kubernetes_config_from_settings(), client_configuration=fake.client_configuration())
        assert reconcile(now=start, executor=executor).started
        (run,) = Run.objects.all()
        (created,) = fake.requests_for("POST", "/jobs$")
    out = io.StringIO()
    call_command("k8s_manifest", "--run", str(run.pk), stdout=out)
    assert yaml.safe_load(out.getvalue()) == created.body
