"""A job across two bookings with the real parts (issue #18 item 1): reconcile with an
injected clock, the real local executor and supervisor, the real runner training Ultralytics
on a tiny synthetic dataset, its progress reports reaching the live web app. The first slot
ends with a checkpoint, the job moves to its owner's next booking by itself, resumes there
from the checkpoint — epochs continue, never restart — and ends succeeded."""

import datetime as dt
import time
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from gpus.models import Gpu, Node
from reservations.models import Membership, Team
from reservations.services import reservation_create
from training.executors.local import DEFAULT_INHERIT_ENV, LocalConfig, LocalExecutor
from training.models import Run, RunMetric, TrainingImage, TrainingJob
from training.reconcile import reconcile
from training.run_state import run_handle
from training.runner.dataset import make_demo_dataset
from training.services import job_submit

pytestmark = [pytest.mark.training, pytest.mark.django_db(transaction=True)]
H = dt.timedelta(hours=1)
GRACE = 60
BATCH_DELAY_ENV = "GPUBOOK_RUNNER_BATCH_DELAY_S"


def wait_for(predicate, what, timeout=300.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_job_trains_across_two_bookings_and_finishes(live_server, settings, tmp_path, monkeypatch):
    settings.GPUBOOK_BASE_URL = live_server.url
    settings.GPUBOOK_DATA_ROOTS = [str(tmp_path / "data")]
    settings.GPUBOOK_RUNS_DIR = tmp_path / "runs"
    settings.GPUBOOK_RUNNER_WORKERS = 0
    settings.GPUBOOK_STOP_GRACE_SECONDS = GRACE
    monkeypatch.setenv(BATCH_DELAY_ENV, "0.2")  # so the stop lands inside an epoch
    data_yaml = make_demo_dataset(tmp_path / "data" / "shapes", train_images=8, val_images=4, imgsz=64, seed=3)
    TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")
    gpu = Gpu.objects.create(node=Node.objects.create(name="ws"), index=0, model_name="CPU stand-in", memory_mib=1024)
    team = Team.objects.create(name="vision", slug="vision", monthly_gpu_hours=100)
    user = get_user_model().objects.create_user(username="alice")
    Membership.objects.create(team=team, user=user)
    start = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0) + dt.timedelta(days=1)
    first = reservation_create(user=user, team=team, gpu_ids=[gpu.pk], start=start, end=start + H, now=start - H)
    second = reservation_create(user=user, team=team, gpu_ids=[gpu.pk], start=start + 3 * H, end=start + 4 * H,
                                now=start - H)
    job = job_submit(user=user, now=start - H, reservation_id=first.pk, document={
        "task_name": "shapes", "image": "yolo:v8n-cu118", "team": "vision",
        "yolo": {"model": "yolov8n.yaml", "data": str(data_yaml), "epochs": 3, "imgsz": 64, "batch": 4, "export": []},
    })
    executor = LocalExecutor(LocalConfig(
        state_dir=tmp_path / "executor", inherit_env=(*DEFAULT_INHERIT_ENV, BATCH_DELAY_ENV),
    ))

    def ended(run):
        return next((o for o in executor.observe() if o.run_id == run.pk and o.state.ended), None)

    try:
        # Slot 1: train until an epoch is done, then the slot ends.
        assert reconcile(now=start, executor=executor).started
        run1 = Run.objects.get()
        wait_for(lambda: RunMetric.objects.filter(run=run1, event="epoch").exists(), "the first epoch")
        assert reconcile(now=start + H - dt.timedelta(seconds=GRACE), executor=executor).stopped == [run1.pk]
        wait_for(lambda: ended(run1), "the first run to checkpoint", timeout=120)
        reconcile(now=start + H - dt.timedelta(seconds=30), executor=executor)
        run1.refresh_from_db()
        assert run1.state == Run.State.CHECKPOINTED, executor.log_tail(run_handle(run1), 100)
        report = reconcile(now=start + H, executor=executor)
        assert report.continued == {job.pk: second.pk}  # moved on by itself

        # Between the slots nothing runs; slot 2 resumes from the checkpoint and finishes.
        assert reconcile(now=start + 2 * H, executor=executor).started == []
        assert reconcile(now=start + 3 * H, executor=executor).started
        run2 = Run.objects.exclude(pk=run1.pk).get()
        assert run2.reservation_id == second.pk and run2.resumed_from == run1.checkpoint_path
        observed = wait_for(lambda: ended(run2), "the second run to finish")
        report = reconcile(now=start + 3 * H + dt.timedelta(minutes=20), executor=executor)
        assert report.ended == [run2.pk], executor.log_tail(observed.handle, 100)
    finally:
        for observed in executor.observe():
            if not observed.state.ended:
                executor.kill(observed.handle)

    run2.refresh_from_db()
    job.refresh_from_db()
    assert run2.state == Run.State.SUCCEEDED and job.state == TrainingJob.State.SUCCEEDED
    epochs1 = list(RunMetric.objects.filter(run=run1, event="epoch").values_list("epoch", flat=True))
    epochs2 = list(RunMetric.objects.filter(run=run2, event="epoch").values_list("epoch", flat=True))
    assert epochs1 and epochs1 == list(range(1, epochs1[-1] + 1))
    # Continue, never restart: the second run starts where the checkpoint left off.
    assert epochs2 and epochs2[0] > 1 and epochs2 == list(range(epochs2[0], 4)) and epochs2[0] <= epochs1[-1] + 1
    assert job.epochs_done == 3
    results = Path(run2.output_dir) / "train" / "results.csv"
    rows = [line.split(",")[0].strip() for line in results.read_text().splitlines()[1:]]
    assert [int(float(row)) for row in rows] == [1, 2, 3]
