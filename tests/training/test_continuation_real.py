"""A job across two and three bookings with the real parts (issue #18 item 1): reconcile
with an injected clock, the real local executor and supervisor, the real runner training
Ultralytics on a tiny synthetic dataset, its progress reports reaching the live web app. Each
slot but the last ends with a checkpoint, the job moves to its owner's next booking by itself,
resumes there from the checkpoint — epochs continue, never restart — and ends succeeded."""

import datetime as dt
import itertools
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from gpus.models import Gpu, Node
from reservations.models import Membership, Team
from reservations.services import reservation_create
from tests.support import wait_for
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




@pytest.mark.parametrize("slots", [2, 3])
def test_a_job_trains_across_bookings_and_finishes(slots, live_server, settings, tmp_path, monkeypatch):
    settings.GPUBOOK_BASE_URL = live_server.url
    settings.GPUBOOK_DATA_ROOTS = [str(tmp_path / "data")]
    settings.GPUBOOK_RUNS_DIR = tmp_path / "runs"
    settings.GPUBOOK_RUNNER_WORKERS = 0
    settings.GPUBOOK_STOP_GRACE_SECONDS = GRACE
    monkeypatch.setenv(BATCH_DELAY_ENV, "0.2")  # so the stop lands inside an epoch
    # Two epochs a slot but the last: a stop that lands an epoch late still leaves work for
    # every slot, so each slot's run trains (and, but the last, checkpoints).
    epochs = 2 * slots - 1
    data_yaml = make_demo_dataset(tmp_path / "data" / "shapes", train_images=8, val_images=4, imgsz=64, seed=3)
    TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")
    gpu = Gpu.objects.create(node=Node.objects.create(name="ws"), index=0, model_name="CPU stand-in", memory_mib=1024)
    team = Team.objects.create(name="vision", slug="vision", monthly_gpu_hours=100)
    user = get_user_model().objects.create_user(username="alice")
    Membership.objects.create(team=team, user=user)
    start = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0) + dt.timedelta(days=1)
    # One-hour bookings three hours apart: the GPU is idle in between.
    bookings = [
        reservation_create(user=user, team=team, gpu_ids=[gpu.pk], start=start + 3 * k * H,
                           end=start + (3 * k + 1) * H, now=start - H)
        for k in range(slots)
    ]
    job = job_submit(user=user, now=start - H, reservation_id=bookings[0].pk, document={
        "task_name": "shapes", "image": "yolo:v8n-cu118", "team": "vision",
        "yolo": {"model": "yolov8n.yaml", "data": str(data_yaml), "epochs": epochs, "imgsz": 64, "batch": 4,
                 "export": []},
    })
    executor = LocalExecutor(LocalConfig(
        state_dir=tmp_path / "executor", inherit_env=(*DEFAULT_INHERIT_ENV, BATCH_DELAY_ENV),
    ))

    def ended(run):
        return next((o for o in executor.observe() if o.run_id == run.pk and o.state.ended), None)

    runs = []
    try:
        for k, booking in enumerate(bookings):
            slot_start, slot_end = booking.start, booking.end
            if k:  # between the slots nothing runs: it waits for its booking, not for idle GPUs
                assert reconcile(now=slot_start - H, executor=executor).started == []
            assert reconcile(now=slot_start, executor=executor).started
            run = Run.objects.exclude(pk__in=[r.pk for r in runs]).get()
            assert run.reservation_id == booking.pk
            if runs:
                assert run.resumed_from == runs[-1].checkpoint_path
            runs.append(run)
            if k == slots - 1:
                break
            # Train until an epoch is done, then the slot ends with a checkpoint.
            wait_for(lambda run=run: RunMetric.objects.filter(run=run, event="epoch").exists(), f"an epoch in slot {k + 1}", timeout=300)
            assert reconcile(now=slot_end - dt.timedelta(seconds=GRACE), executor=executor).stopped == [run.pk]
            wait_for(lambda run=run: ended(run), f"run {k + 1} to checkpoint", timeout=120)
            reconcile(now=slot_end - dt.timedelta(seconds=30), executor=executor)
            run.refresh_from_db()
            assert run.state == Run.State.CHECKPOINTED, executor.log_tail(run_handle(run), 100)
            report = reconcile(now=slot_end, executor=executor)
            assert report.continued == {job.pk: bookings[k + 1].pk}  # moved on by itself
        last = runs[-1]
        observed = wait_for(lambda: ended(last), "the last run to finish", timeout=300)
        report = reconcile(now=last.reservation.start + dt.timedelta(minutes=20), executor=executor)
        assert report.ended == [last.pk], executor.log_tail(observed.handle, 100)
    finally:
        for observed in executor.observe():
            if not observed.state.ended:
                executor.kill(observed.handle)

    for run in runs:
        run.refresh_from_db()
    job.refresh_from_db()
    assert runs[-1].state == Run.State.SUCCEEDED and job.state == TrainingJob.State.SUCCEEDED
    assert [run.state for run in runs[:-1]] == [Run.State.CHECKPOINTED] * (slots - 1)
    trained = [list(RunMetric.objects.filter(run=run, event="epoch").values_list("epoch", flat=True)) for run in runs]
    assert trained[0] and trained[0] == list(range(1, trained[0][-1] + 1))
    # Continue, never restart: each run starts where the previous run's checkpoint left off.
    for before, after in itertools.pairwise(trained):
        assert after and after[0] > 1 and after == list(range(after[0], after[-1] + 1))
        assert after[0] <= before[-1] + 1
    assert trained[-1][-1] == epochs and job.epochs_done == epochs
    results = Path(runs[-1].output_dir) / "train" / "results.csv"
    rows = [line.split(",")[0].strip() for line in results.read_text().splitlines()[1:]]
    assert [int(float(row)) for row in rows] == list(range(1, epochs + 1))
