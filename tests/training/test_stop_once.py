"""A stop never turns a checkpoint into a failure (issue #18 item 0), through the real parts:
reconcile with a one-second tick, the real local executor and supervisor, and the real
runner training Ultralytics on a tiny dataset, with a checkpoint that takes longer than a
tick to save. While it saves, more SIGTERMs arrive — at the supervisor (as a re-delivered
stop would) and straight at the run's process group (as when the supervisor is gone): the
supervisor forwards only the first, the runner ignores the rest, and the run is recorded
as checkpointed."""

import contextlib
import datetime as dt
import os
import signal
import time
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from gpus.models import Gpu, Node
from reservations.models import Membership, Team
from reservations.services import reservation_create
from training.executors import local_supervisor as sv
from training.executors.local import DEFAULT_INHERIT_ENV, LocalConfig, LocalExecutor
from training.models import Run, TrainingImage, TrainingJob
from training.reconcile import reconcile
from training.run_state import run_handle
from training.runner.dataset import make_demo_dataset
from training.runner.stop import SAVE_DELAY_ENV
from training.services import job_submit

pytestmark = [pytest.mark.training, pytest.mark.django_db(transaction=True)]
H = dt.timedelta(hours=1)
SECOND = dt.timedelta(seconds=1)
GRACE = 60
SAVE_DELAY_S = 3.0  # three ticks
BATCH_DELAY_ENV = "GPUBOOK_RUNNER_BATCH_DELAY_S"


class CountingExecutor(LocalExecutor):
    """The real local executor, counting the stops reconcile asks it for."""

    def __init__(self, config: LocalConfig) -> None:
        super().__init__(config)
        self.stops: list[int] = []

    def stop(self, handle, grace_s):
        self.stops.append(handle.run_id)
        super().stop(handle, grace_s)


def test_a_slow_checkpoint_survives_one_second_ticks_and_repeated_sigterms(settings, tmp_path, monkeypatch):
    settings.GPUBOOK_DATA_ROOTS = [str(tmp_path / "data")]
    settings.GPUBOOK_RUNS_DIR = tmp_path / "runs"
    settings.GPUBOOK_RUNNER_WORKERS = 0
    settings.GPUBOOK_STOP_GRACE_SECONDS = GRACE
    settings.GPUBOOK_BASE_URL = "http://127.0.0.1:9"  # no web app here: reports fail quietly
    monkeypatch.setenv(SAVE_DELAY_ENV, str(SAVE_DELAY_S))
    # Slow batches, so the stop (sent within a poll of the first batch event) lands inside a
    # training batch, where a checkpoint can be written, not in epoch 0's validation, where
    # there is nothing to save yet (two batches of 0.2 s made that a race under load).
    monkeypatch.setenv(BATCH_DELAY_ENV, "1.0")
    data_yaml = make_demo_dataset(tmp_path / "data" / "shapes", train_images=8, val_images=4, imgsz=64, seed=3)
    TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")
    gpu = Gpu.objects.create(node=Node.objects.create(name="ws"), index=0, model_name="CPU stand-in", memory_mib=1024)
    team = Team.objects.create(name="vision", slug="vision", monthly_gpu_hours=100)
    user = get_user_model().objects.create_user(username="alice")
    Membership.objects.create(team=team, user=user)
    start = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0) + dt.timedelta(days=1)
    reservation = reservation_create(user=user, team=team, gpu_ids=[gpu.pk], start=start, end=start + H,
                                     now=start - H)
    job = job_submit(user=user, now=start - H, reservation_id=reservation.pk, document={
        "task_name": "shapes", "image": "yolo:v8n-cu118", "team": "vision",
        "yolo": {"model": "yolov8n.yaml", "data": str(data_yaml), "epochs": 50, "imgsz": 64, "batch": 4},
    })
    executor = CountingExecutor(LocalConfig(
        state_dir=tmp_path / "executor", inherit_env=(*DEFAULT_INHERIT_ENV, SAVE_DELAY_ENV, BATCH_DELAY_ENV),
    ))
    try:
        assert reconcile(now=start, executor=executor).started
        run = Run.objects.get()
        handle = run_handle(run)
        deadline = time.monotonic() + 240
        while '"event": "batch"' not in executor.log_tail(handle, 400).replace('":"', '": "'):
            assert time.monotonic() < deadline, executor.log_tail(handle)
            time.sleep(0.5)

        # One-second ticks from end − grace, each also sending extra SIGTERMs while it saves.
        run_dir = tmp_path / "executor" / handle.name
        now = start + H - dt.timedelta(seconds=GRACE)
        for _ in range(90):
            report = reconcile(now=now, executor=executor)
            if run.pk in report.ended:
                break
            if executor.stops:  # the stop is out: repeats must not hurt it
                supervisor = sv.read_json(run_dir / "supervisor.json") or {}
                child = sv.read_json(run_dir / "child.json") or {}
                with contextlib.suppress(ProcessLookupError, TypeError):
                    os.kill(supervisor.get("pid"), signal.SIGTERM)
                with contextlib.suppress(ProcessLookupError, TypeError):
                    os.killpg(child.get("pgid"), signal.SIGTERM)
            time.sleep(1.0)
            now += SECOND
        else:
            raise AssertionError(f"the run did not end: {executor.log_tail(handle)}")

        run.refresh_from_db()
        job.refresh_from_db()
        log = executor.log_tail(handle, 2000)
        assert executor.stops == [run.pk]  # reconcile sent the stop once
        assert run.state == Run.State.CHECKPOINTED and run.exit_code == 75, log
        assert Path(run.checkpoint_path).is_file() and job.checkpoint_path == run.checkpoint_path
        assert job.state == TrainingJob.State.QUEUED
        assert log.count("SIGTERM to the run's process group") == 1, log  # forwarded once
        assert "SIGTERM not forwarded again" in log
        assert run.stop_sent_at == start + H - dt.timedelta(seconds=GRACE) and run.stops_sent == 1
    finally:
        for observed in executor.observe():
            if not observed.state.ended:
                executor.kill(observed.handle)
