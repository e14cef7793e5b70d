"""reconcile(now) tick by tick with an injected clock, the real local executor and small
stand-in programs (a real training run is tested in tests/training/runner/)."""

import datetime as dt
import sys
import threading

import pytest
from django.contrib.auth import get_user_model
from django.db import connections

from gpus.models import Gpu, Node
from reservations.models import Membership, Reservation, Team
from reservations.services import reservation_create
from tests.support import wait_for
from training import reconcile as reconcile_module
from training.executors.base import RunState
from training.executors.local import LocalConfig, LocalExecutor
from training.models import Run, TrainingImage, TrainingJob
from training.reconcile import reconcile
from training.services import job_submit

UTC = dt.UTC
MIN = dt.timedelta(minutes=1)
H = dt.timedelta(hours=1)
GRACE = 60

# Prints its GPUs, then waits; SIGTERM → "checkpoint" and exit 75 (like the runner).
PATIENT = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: (print('checkpointing', flush=True), sys.exit(75)))
print('ready gpus=' + os.environ.get('CUDA_VISIBLE_DEVICES', ''), flush=True)
while True:
    time.sleep(0.05)
"""
# Ignores SIGTERM: only a kill ends it.
STUBBORN = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print('ready', flush=True)
while True:
    time.sleep(0.05)
"""
QUICK = "print('done', flush=True)"


@pytest.fixture
def world(db, tmp_path, settings):
    settings.GPUBOOK_RUNS_DIR = tmp_path / "runs"
    settings.GPUBOOK_STOP_GRACE_SECONDS = GRACE
    settings.GPUBOOK_NO_SHOW_MINUTES = 15
    # transactional tests flush the catalog the data migration seeded
    TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")
    node = Node.objects.create(name="ws-1")
    gpus = [Gpu.objects.create(node=node, index=i, model_name="RTX 4090", memory_mib=24564) for i in range(2)]
    team = Team.objects.create(name="vision", slug="vision", monthly_gpu_hours=1000)
    user = get_user_model().objects.create_user(username="alice")
    Membership.objects.create(team=team, user=user)
    executor = LocalExecutor(LocalConfig(state_dir=tmp_path / "executor"))
    # A slot two days ahead of the real clock: the executors' real-time backstops never fire.
    start = dt.datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + dt.timedelta(days=2)
    yield {"node": node, "gpus": gpus, "team": team, "user": user, "executor": executor, "start": start}
    for observed in executor.observe():
        if not observed.state.ended:
            executor.kill(observed.handle)


def submit(world, program: str, *, reservation=None, gpus=1, estimate=None, name="job"):
    spec = {"task_name": name, "image": "yolo:v8n-cu118", "team": "vision", "resources": {"gpu": gpus},
            "command": [sys.executable, "-c", program], "checkpointable": True}
    if estimate:
        spec["estimated_duration"] = estimate
    return job_submit(user=world["user"], document=spec, now=world["start"] - 2 * H,
                      reservation_id=reservation.pk if reservation else None)


def book(world, start, end, gpus=None):
    return reservation_create(user=world["user"], team=world["team"], gpu_ids=[g.pk for g in gpus or world["gpus"][:1]],
                              start=start, end=end, now=start - 3 * H)


def tick(world, now):
    report = reconcile(now=now, executor=world["executor"])
    assert not report.skipped
    return report




def log_of(world, run) -> str:
    from training.run_state import run_handle

    run.refresh_from_db()
    return world["executor"].log_tail(run_handle(run))


def ended(world, run):
    return wait_for(lambda: next((o for o in world["executor"].observe() if o.run_id == run.pk and o.state.ended), None),
                    f"run {run.pk} to end")


@pytest.mark.django_db(transaction=True)
def test_reserved_job_starts_at_slot_start_and_checkpoints_at_slot_end(world):
    start = world["start"]
    reservation = book(world, start, start + H, gpus=world["gpus"][1:2])
    job = submit(world, PATIENT, reservation=reservation)

    assert tick(world, start - 10 * MIN).started == []
    report = tick(world, start)
    (run,) = Run.objects.all()
    assert report.started == [run.pk] and run.state == Run.State.RUNNING and run.kind == "reserved"
    assert run.must_end_by == start + H
    assert "ready gpus=1" in wait_for(lambda: log_of(world, run) if "ready" in log_of(world, run) else "", "ready")
    assert Reservation.objects.get(pk=reservation.pk).status == Reservation.Status.ACTIVE

    assert tick(world, start + H - 2 * MIN).stopped == []  # not yet: grace is 60 s
    report = tick(world, start + H - dt.timedelta(seconds=GRACE))
    assert report.stopped == [run.pk]
    run.refresh_from_db()
    assert run.state == Run.State.STOPPING and run.stop_requested_at == start + H - dt.timedelta(seconds=GRACE)
    assert ended(world, run).state == RunState.CHECKPOINTED
    report = tick(world, start + H - dt.timedelta(seconds=30))
    assert report.ended == [run.pk]
    run.refresh_from_db()
    job.refresh_from_db()
    assert run.state == Run.State.CHECKPOINTED and run.exit_code == 75
    assert job.state == TrainingJob.State.QUEUED  # resumable: it runs again in its next slot


@pytest.mark.django_db(transaction=True)
def test_a_run_that_ignores_the_stop_is_killed_at_the_end(world):
    start = world["start"]
    reservation = book(world, start, start + H)
    submit(world, STUBBORN, reservation=reservation)
    tick(world, start)
    (run,) = Run.objects.all()
    wait_for(lambda: "ready" in log_of(world, run), "ready")
    tick(world, start + H - dt.timedelta(seconds=GRACE))
    assert tick(world, start + H - dt.timedelta(seconds=1)).killed == []
    assert tick(world, start + H).killed == [run.pk]
    ended(world, run)
    tick(world, start + H + dt.timedelta(seconds=5))
    run.refresh_from_db()
    assert run.state == Run.State.KILLED and run.ended_at == start + H + dt.timedelta(seconds=5)


@pytest.mark.django_db(transaction=True)
def test_backfill_fills_idle_gpu_and_leaves_before_the_reservation(world):
    start = world["start"]
    reservation = book(world, start + 2 * H, start + 3 * H, gpus=world["gpus"])  # the whole node
    job = submit(world, PATIENT, estimate="30m")  # queued, not attached: backfill
    report = tick(world, start)
    (run,) = Run.objects.all()
    assert report.started == [run.pk] and run.kind == "backfill" and run.job_id == job.pk
    wait_for(lambda: "ready" in log_of(world, run), "ready")

    # The estimate was wrong: it is still running when the reservation approaches.
    stop_at = reservation.start - dt.timedelta(seconds=GRACE)
    assert tick(world, stop_at - MIN).stopped == []
    assert tick(world, stop_at).stopped == [run.pk]
    assert ended(world, run).state == RunState.CHECKPOINTED
    tick(world, stop_at + dt.timedelta(seconds=10))
    job.refresh_from_db()
    assert job.state == TrainingJob.State.QUEUED and job.times_preempted == 1
    # It does not come back onto GPUs that are about to be reserved.
    tick(world, reservation.start - dt.timedelta(seconds=30))
    assert not Run.objects.filter(state__in=Run.LIVE).exists()


@pytest.mark.django_db(transaction=True)
def test_finished_job_releases_the_rest_of_its_slot(world):
    start = world["start"]
    reservation = book(world, start, start + 4 * H)
    job = submit(world, QUICK, reservation=reservation)
    tick(world, start)
    (run,) = Run.objects.all()
    assert ended(world, run).state == RunState.SUCCEEDED
    now = start + 20 * MIN
    report = tick(world, now)
    assert report.ended == [run.pk] and report.released == [reservation.pk]
    job.refresh_from_db()
    reservation.refresh_from_db()
    assert job.state == TrainingJob.State.SUCCEEDED
    assert reservation.status == Reservation.Status.RELEASED and reservation.end == start + 30 * MIN


@pytest.mark.django_db(transaction=True)
def test_no_show_is_released(world):
    start = world["start"]
    reservation = book(world, start, start + 2 * H)
    assert tick(world, start + 14 * MIN).released == []
    assert tick(world, start + 15 * MIN).released == [reservation.pk]
    reservation.refresh_from_db()
    assert reservation.status == Reservation.Status.RELEASED and reservation.end == start + 30 * MIN


class Crash(Exception):
    """Stands for the process dying at this point."""


@pytest.mark.django_db(transaction=True)
def test_crash_between_claim_and_executor_call_converges(world, monkeypatch):
    start = world["start"]
    submit(world, PATIENT, reservation=book(world, start, start + H))

    def crash(*args, **kwargs):
        raise Crash

    with monkeypatch.context() as patched:
        patched.setattr(reconcile_module, "_launch", crash)
        with pytest.raises(Crash):
            tick(world, start)
    (run,) = Run.objects.all()
    assert run.state == Run.State.STARTING and world["executor"].observe() == []
    report = tick(world, start + dt.timedelta(seconds=5))
    assert report.started == [run.pk]
    assert Run.objects.count() == 1 and len(world["executor"].observe()) == 1
    run.refresh_from_db()
    assert run.state == Run.State.RUNNING


@pytest.mark.django_db(transaction=True)
def test_crash_between_executor_call_and_commit_converges(world, monkeypatch):
    start = world["start"]
    submit(world, PATIENT, reservation=book(world, start, start + H))
    real_start = world["executor"].start

    def start_then_crash(spec, **kwargs):
        real_start(spec, **kwargs)
        raise Crash

    with monkeypatch.context() as patched:
        patched.setattr(world["executor"], "start", start_then_crash)
        with pytest.raises(Crash):
            tick(world, start)
    (run,) = Run.objects.all()
    assert run.state == Run.State.STARTING
    report = tick(world, start + dt.timedelta(seconds=5))
    assert report.started == []  # nothing new: it was already running
    run.refresh_from_db()
    assert run.state == Run.State.RUNNING and len(world["executor"].observe()) == 1


@pytest.mark.django_db(transaction=True)
def test_crash_after_stop_claim_still_stops(world, monkeypatch):
    start = world["start"]
    submit(world, PATIENT, reservation=book(world, start, start + H))
    tick(world, start)
    (run,) = Run.objects.all()
    wait_for(lambda: "ready" in log_of(world, run), "ready")
    with monkeypatch.context() as patched:
        patched.setattr(world["executor"], "stop", lambda *a, **k: (_ for _ in ()).throw(Crash()))
        with pytest.raises(Crash):
            tick(world, start + H - dt.timedelta(seconds=GRACE))
    run.refresh_from_db()
    assert run.state == Run.State.STOPPING  # claimed, but SIGTERM never went out
    tick(world, start + H - dt.timedelta(seconds=50))  # repair re-delivers the stop
    assert ended(world, run).state == RunState.CHECKPOINTED


@pytest.mark.postgres
@pytest.mark.parametrize("with_lock", [True, False], ids=["advisory-lock", "compare-and-set-only"])
@pytest.mark.django_db(transaction=True)
def test_two_reconcilers_start_one_run(world, monkeypatch, postgres_only, with_lock):
    start = world["start"]
    submit(world, PATIENT, reservation=book(world, start, start + H))
    if not with_lock:
        import contextlib

        monkeypatch.setattr(reconcile_module, "reconcile_lock", lambda: contextlib.nullcontext(True))
    barrier = threading.Barrier(2)
    reports = []

    def run():
        try:
            barrier.wait(timeout=10)
            reports.append(reconcile(now=start, executor=world["executor"]))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert Run.objects.count() == 1
    assert sum(len(report.started) for report in reports) == 1
    assert len(world["executor"].observe()) == 1


@pytest.mark.django_db(transaction=True)
def test_cancelling_a_running_job_stops_its_run_with_a_checkpoint(world):
    from training.services import job_cancel

    start = world["start"]
    job = submit(world, PATIENT, reservation=book(world, start, start + H))
    tick(world, start)
    (run,) = Run.objects.all()
    wait_for(lambda: "ready" in log_of(world, run), "ready")
    job_cancel(job_id=job.pk, actor=world["user"], now=start + MIN)
    tick(world, start + MIN)  # delivers the stop
    assert ended(world, run).state == RunState.CHECKPOINTED
    tick(world, start + 2 * MIN)
    run.refresh_from_db()
    job.refresh_from_db()
    assert run.state == Run.State.CHECKPOINTED and job.state == TrainingJob.State.CANCELLED
    assert tick(world, start + 3 * MIN).started == []  # a cancelled job never comes back
