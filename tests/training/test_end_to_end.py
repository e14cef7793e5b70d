"""The whole path with real parts: a booking with a YOLO job → reconcile at slot start →
the local executor → the real runner training Ultralytics on a tiny synthetic dataset →
progress reports into the live web app with the run's token → artifacts registered → the
job succeeds and the rest of the slot is released."""

import datetime as dt
import time

import pytest
from django.contrib.auth import get_user_model

from gpus.models import Gpu, Node
from reservations.models import Membership, Reservation, Team
from reservations.services import reservation_create
from training.executors.local import LocalConfig, LocalExecutor
from training.models import Artifact, Run, RunMetric, TrainingImage, TrainingJob
from training.reconcile import reconcile
from training.runner.dataset import make_demo_dataset
from training.services import job_submit

pytestmark = [pytest.mark.training, pytest.mark.django_db(transaction=True)]
H = dt.timedelta(hours=1)


def test_booked_yolo_job_trains_reports_and_finishes(live_server, settings, tmp_path):
    settings.GPUBOOK_BASE_URL = live_server.url
    settings.GPUBOOK_DATA_ROOTS = [str(tmp_path / "data")]
    settings.GPUBOOK_RUNS_DIR = tmp_path / "runs"
    settings.GPUBOOK_RUNNER_WORKERS = 0
    data_yaml = make_demo_dataset(tmp_path / "data" / "shapes", train_images=8, val_images=4, imgsz=64, seed=3)
    TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")
    node = Node.objects.create(name="ws")
    gpu = Gpu.objects.create(node=node, index=0, model_name="CPU stand-in", memory_mib=1024)
    team = Team.objects.create(name="vision", slug="vision", monthly_gpu_hours=100)
    user = get_user_model().objects.create_user(username="alice")
    Membership.objects.create(team=team, user=user)
    start = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0) + dt.timedelta(days=1)
    reservation = reservation_create(user=user, team=team, gpu_ids=[gpu.pk], start=start, end=start + 2 * H,
                                     now=start - H)
    job = job_submit(user=user, now=start - H, reservation_id=reservation.pk, document={
        "task_name": "shapes", "image": "yolo:v8n-cu118", "team": "vision",
        "yolo": {"model": "yolov8n.yaml", "data": str(data_yaml), "epochs": 2, "imgsz": 64, "batch": 4},
    })
    executor = LocalExecutor(LocalConfig(state_dir=tmp_path / "executor"))

    assert reconcile(now=start, executor=executor).started
    run = Run.objects.get()
    deadline = time.monotonic() + 300
    observed = None
    while time.monotonic() < deadline:
        observed = next((item for item in executor.observe() if item.run_id == run.pk and item.state.ended), None)
        if observed:
            break
        time.sleep(0.5)
    assert observed is not None, "the training did not finish in 5 minutes"
    report = reconcile(now=start + 10 * dt.timedelta(minutes=1), executor=executor)
    assert report.ended == [run.pk] and report.released == [reservation.pk], executor.log_tail(observed.handle)

    run.refresh_from_db()
    job.refresh_from_db()
    reservation.refresh_from_db()
    assert run.state == Run.State.SUCCEEDED and run.exit_code == 0
    assert job.state == TrainingJob.State.SUCCEEDED and job.epochs_done == 2
    assert reservation.status == Reservation.Status.RELEASED and reservation.end == start + dt.timedelta(minutes=30)
    # The runner's reports reached the web app through its token.
    epochs = list(RunMetric.objects.filter(run=run, event="epoch").values_list("epoch", flat=True))
    assert epochs == [1, 2]
    assert "box_loss" in RunMetric.objects.filter(run=run, event="epoch").last().values
    names = set(Artifact.objects.filter(run=run).values_list("name", flat=True))
    assert {"best.pt", "last.pt", "results.csv"} <= names
    best = Artifact.objects.get(run=run, name="best.pt")
    assert (tmp_path / "runs" / "vision" / f"job-{job.pk}" / best.path).stat().st_size == best.size_bytes
