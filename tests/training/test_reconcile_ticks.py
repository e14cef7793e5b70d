"""reconcile's decisions tick by tick with an injected clock and the in-memory FakeExecutor:
which executor calls each tick makes, with which handle and grace, and what is recorded.
(The real executors are driven through reconcile in test_reconcile.py and test_end_to_end.py.)"""

import datetime as dt
import json
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from gpus.models import Gpu, Node
from reservations.models import Membership, Team
from reservations.services import reservation_create
from tests.fakes.executor import FakeExecutor
from training import watchdog
from training.models import Run, TrainingImage, TrainingJob
from training.reconcile import reconcile
from training.run_state import run_handle
from training.services import job_cancel, job_submit

UTC = dt.UTC
MIN = dt.timedelta(minutes=1)
H = dt.timedelta(hours=1)
GRACE = 60
START = dt.datetime(2031, 3, 3, 9, 0, tzinfo=UTC)


@pytest.fixture
def world(db, tmp_path, settings):
    settings.GPUBOOK_RUNS_DIR = tmp_path / "runs"
    settings.GPUBOOK_STOP_GRACE_SECONDS = GRACE
    settings.GPUBOOK_NO_SHOW_MINUTES = 15
    settings.GPUBOOK_DATA_ROOTS = [str(tmp_path / "data") + "/{team}"]
    TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")
    node = Node.objects.create(name="ws-1")
    gpus = [Gpu.objects.create(node=node, index=i, model_name="RTX 4090", memory_mib=24564) for i in range(2)]
    team = Team.objects.create(name="vision", slug="vision", monthly_gpu_hours=1000)
    user = get_user_model().objects.create_user(username="alice")
    Membership.objects.create(team=team, user=user)
    return {"gpus": gpus, "team": team, "user": user, "executor": FakeExecutor(), "tmp": tmp_path}


def command_spec(name="job", **more):
    return {"task_name": name, "image": "yolo:v8n-cu118", "team": "vision", "resources": {"gpu": 1},
            "command": [sys.executable, "-c", "pass"], "checkpointable": True, **more}


def submit(world, document=None, *, reservation=None, now=START - 2 * H):
    return job_submit(user=world["user"], document=document or command_spec(), now=now,
                      reservation_id=reservation.pk if reservation else None)


def book(world, start, end, gpus=None):
    return reservation_create(user=world["user"], team=world["team"], gpu_ids=[g.pk for g in gpus or world["gpus"][:1]],
                              start=start, end=end, now=start - 3 * H)


def tick(world, now):
    report = reconcile(now=now, executor=world["executor"])
    assert not report.skipped and not report.errors, report.errors
    return report


def test_reserved_run_starts_stops_with_grace_and_is_recorded_checkpointed(world):
    fake = world["executor"]
    reservation = book(world, START, START + H, gpus=world["gpus"][1:2])
    job = submit(world, reservation=reservation)

    assert tick(world, START - MIN).started == [] and fake.calls == []
    report = tick(world, START)
    (run,) = Run.objects.all()
    assert report.started == [run.pk]
    (start,) = fake.calls_of("start")
    assert start.spec.gpu_indices == (1,) and start.spec.must_end_by == START + H and start.now == START
    assert run_handle(run) == fake.runs[run.pk].handle  # stored as start() returned it

    tick(world, START + H - GRACE * dt.timedelta(seconds=1) - MIN)
    assert fake.calls_of("stop") == []
    report = tick(world, START + H - dt.timedelta(seconds=GRACE))
    assert report.stopped == [run.pk]
    (stop,) = fake.calls_of("stop")
    assert stop.handle.namespace == "fake-vision" and stop.grace_s == GRACE

    checkpoint = fake.checkpoint(run.pk, epoch=3)
    report = tick(world, START + H - dt.timedelta(seconds=30))
    assert report.ended == [run.pk]
    run.refresh_from_db()
    job.refresh_from_db()
    assert run.state == Run.State.CHECKPOINTED and run.exit_code == 75 and run.checkpoint_path == str(checkpoint)
    assert job.state == TrainingJob.State.QUEUED and job.checkpoint_path == str(checkpoint)
    assert [call.run_id for call in fake.calls_of("cleanup")] == [run.pk]


def test_a_run_that_ignores_the_stop_is_killed_at_the_slot_end(world):
    fake = world["executor"]
    submit(world, reservation=book(world, START, START + H))
    tick(world, START)
    (run,) = Run.objects.all()
    tick(world, START + H - dt.timedelta(seconds=GRACE))
    assert tick(world, START + H - dt.timedelta(seconds=1)).killed == []
    assert tick(world, START + H).killed == [run.pk]
    (kill,) = fake.calls_of("kill")
    assert kill.handle == run_handle(run)
    tick(world, START + H + dt.timedelta(seconds=5))
    run.refresh_from_db()
    assert run.state == Run.State.KILLED


def test_backfill_is_stopped_before_the_reservation_and_requeued(world):
    fake = world["executor"]
    reservation = book(world, START + 2 * H, START + 3 * H, gpus=world["gpus"])
    job = submit(world, command_spec(estimated_duration="30m"))
    report = tick(world, START)
    (run,) = Run.objects.all()
    assert report.started == [run.pk] and run.kind == Run.Kind.BACKFILL
    stop_at = reservation.start - dt.timedelta(seconds=GRACE)
    assert tick(world, stop_at - MIN).stopped == []
    assert tick(world, stop_at).stopped == [run.pk]
    fake.checkpoint(run.pk)
    tick(world, stop_at + dt.timedelta(seconds=10))
    job.refresh_from_db()
    assert job.state == TrainingJob.State.QUEUED and job.times_preempted == 1
    assert tick(world, reservation.start - dt.timedelta(seconds=30)).started == []


def test_cancel_and_watchdog_stops_are_delivered_by_repair_with_the_stored_handle(world):
    fake = world["executor"]
    job = submit(world, reservation=book(world, START, START + H))
    other = submit(world, command_spec("other"), reservation=book(world, START, START + H, gpus=world["gpus"][1:]))
    tick(world, START)
    run, other_run = Run.objects.get(job=job), Run.objects.get(job=other)

    job_cancel(job_id=job.pk, actor=world["user"], now=START + MIN)
    assert watchdog.run_stop_for_anomaly(run=other_run, reason="Stopped: too hot.", now=START + MIN)
    tick(world, START + MIN)
    stops = {call.run_id: call for call in fake.calls_of("stop")}
    assert set(stops) == {run.pk, other_run.pk}
    assert stops[run.pk].handle == run_handle(run) and stops[run.pk].grace_s == GRACE


def test_launch_reads_the_spec_normalized_at_submit(world, settings):
    """Launch reads the spec as parsed at submit (what it leaves out is filled from the image's
    defaults when the run starts); a later edit of the raw document changes nothing."""
    data = world["tmp"] / "data" / "vision" / "data.yaml"
    document = {"task_name": "yolo", "image": "yolo:v8n-cu118", "team": "vision",
                "yolo": {"model": "yolov8n.yaml", "data": str(data), "epochs": 4, "batch": 16}}
    job = submit(world, document, reservation=book(world, START, START + H))
    assert job.parsed_spec["yolo"]["epochs"] == 4 and job.parsed_spec["yolo"]["imgsz"] is None
    image = TrainingImage.objects.get(name="yolo", tag="v8n-cu118")
    image.default_hyperparameters = {"imgsz": 320}
    image.save()
    TrainingJob.objects.filter(pk=job.pk).update(spec={"yolo": {"epochs": 999, "imgsz": 999, "batch": 999}})
    tick(world, START)
    (run,) = Run.objects.all()
    (start,) = world["executor"].calls_of("start")
    spec_file = Path(start.spec.argv[-1])
    runner = json.loads(spec_file.read_text())
    assert (runner["epochs"], runner["imgsz"], runner["batch"]) == (4, 320, 16)
    assert runner["data"] == str(data) and runner["run_id"] == str(run.pk)


# --- a stop never turns a checkpoint into a failure (issue #18 item 0) --------------------------
def test_a_stop_is_sent_once_across_one_second_ticks(world):
    fake = world["executor"]
    submit(world, reservation=book(world, START, START + H))
    tick(world, START)
    (run,) = Run.objects.all()
    stop_at = START + H - dt.timedelta(seconds=GRACE)
    for second in range(30):  # a one-second tick while the run saves its checkpoint
        tick(world, stop_at + dt.timedelta(seconds=second))
    assert len(fake.calls_of("stop", run.pk)) == 1
    run.refresh_from_db()
    assert run.stop_sent_at == stop_at and run.stops_sent == 1
    fake.checkpoint(run.pk)
    tick(world, stop_at + dt.timedelta(seconds=31))
    run.refresh_from_db()
    assert run.state == Run.State.CHECKPOINTED


def test_a_stop_is_resent_once_when_its_receiver_is_provably_gone(world):
    fake = world["executor"]
    job = submit(world, reservation=book(world, START, START + H))
    tick(world, START)
    (run,) = Run.objects.all()
    job_cancel(job_id=job.pk, actor=world["user"], now=START + MIN)
    tick(world, START + MIN)
    tick(world, START + MIN + dt.timedelta(seconds=1))
    assert len(fake.calls_of("stop", run.pk)) == 1
    fake.set_reason(run.pk, "supervisor-lost")  # the supervisor that was to forward it died
    for second in range(2, 6):
        tick(world, START + MIN + dt.timedelta(seconds=second))
    assert len(fake.calls_of("stop", run.pk)) == 2  # re-sent once, never again


def test_a_checkpointed_run_that_died_of_a_later_signal_is_checkpointed(world):
    fake = world["executor"]
    job = submit(world, reservation=book(world, START, START + H))
    tick(world, START)
    (run,) = Run.objects.all()
    tick(world, START + H - dt.timedelta(seconds=GRACE))
    checkpoint = fake.checkpoint(run.pk, died_of=15)  # wrote last.pt and "checkpointed", then exit 143
    tick(world, START + H - dt.timedelta(seconds=50))
    run.refresh_from_db()
    job.refresh_from_db()
    assert (run.state, run.exit_code, run.checkpoint_path) == (Run.State.CHECKPOINTED, 143, str(checkpoint))
    assert job.state == TrainingJob.State.QUEUED and job.checkpoint_path == str(checkpoint)


def test_a_checkpointed_message_without_a_readable_checkpoint_is_not_trusted(world):
    fake = world["executor"]
    job = submit(world, reservation=book(world, START, START + H))
    tick(world, START)
    (run,) = Run.objects.all()
    fake.checkpoint(run.pk, died_of=15, write_file=False)  # says "checkpointed", but no last.pt
    tick(world, START + 2 * MIN)
    run.refresh_from_db()
    job.refresh_from_db()
    assert run.state == Run.State.FAILED and job.state == TrainingJob.State.FAILED
