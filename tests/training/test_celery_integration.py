"""Real Celery worker + beat, real Redis, real PostgreSQL, the local executor: a booked job
starts on time and is stopped on time, with no test code in the loop."""

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection

from gpus.models import Gpu, Node
from reservations.models import Membership, Reservation, ReservationGpu, Team
from training.models import Run, TrainingImage
from training.services import job_submit

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
# A database of its own, flushed before use; GPUBOOK_TEST_REDIS_DB lets parallel checkouts differ.
REDIS_DB = int(os.environ.get("GPUBOOK_TEST_REDIS_DB", "7"))
SLOT_RECORDER = str(Path(__file__).resolve().parent.parent / "fakes" / "slot_recorder.py")
GRACE_S = 3



def redis_url() -> str:
    return f"redis://127.0.0.1:6379/{REDIS_DB}"


@pytest.fixture
def celery_processes(tmp_path, postgres_only):
    try:
        redis.Redis.from_url(redis_url()).flushdb()
    except redis.ConnectionError:
        pytest.fail("Redis is not reachable at 127.0.0.1:6379 (start it: see README)")
    database = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}/{database['NAME']}",
        "REDIS_URL": redis_url(), "SECRET_KEY": "celery-test", "DEBUG": "false",
        "GPUBOOK_VAR_DIR": str(tmp_path / "var"), "GPUBOOK_TICK_SECONDS": "1",
        "GPUBOOK_STOP_GRACE_SECONDS": str(GRACE_S), "DJANGO_SETTINGS_MODULE": "config.settings",
        "GPUBOOK_SINGLE_USER": "true",  # the recorder is a command job run as this user
    }
    celery = [sys.executable, "-m", "celery", "-A", "config"]
    worker_log = open(tmp_path / "worker.log", "w")  # noqa: SIM115 — closed in teardown
    worker = subprocess.Popen(
        [*celery, "worker", "--pool=solo", "--concurrency=1", "-l", "info", "--without-gossip", "--without-mingle"],
        env=env, stdout=worker_log, stderr=subprocess.STDOUT, cwd=settings.BASE_DIR, start_new_session=True,
    )
    beat = subprocess.Popen(
        [*celery, "beat", "-l", "info", "-s", str(tmp_path / "beat-schedule")],
        env=env, stdout=open(tmp_path / "beat.log", "w"), stderr=subprocess.STDOUT,  # noqa: SIM115
        cwd=settings.BASE_DIR, start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while "ready." not in (tmp_path / "worker.log").read_text():
        assert worker.poll() is None, (tmp_path / "worker.log").read_text()
        assert time.monotonic() < deadline, "celery worker did not become ready"
        time.sleep(0.1)
    yield tmp_path
    for process in (beat, worker):
        os.killpg(process.pid, signal.SIGTERM)
    for process in (beat, worker):
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
    worker_log.close()


def test_slot_start_and_end_are_on_time(celery_processes):
    tmp_path = celery_processes
    TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")
    node = Node.objects.create(name="ws-celery")
    gpu = Gpu.objects.create(node=node, index=0, model_name="RTX 4090", memory_mib=24564)
    team = Team.objects.create(name="vision", slug="vision", monthly_gpu_hours=100)
    user = get_user_model().objects.create_user(username="alice")
    Membership.objects.create(team=team, user=user)
    # Seconds-long slots are inserted directly: the grid rule of the booking service is not
    # what this test is about, and waiting for a real 30-minute edge is not an option.
    start = dt.datetime.fromtimestamp(int(time.time()) + 6, tz=dt.UTC)
    end = start + dt.timedelta(seconds=12)
    reservation = Reservation.objects.create(user=user, team=team, node=node, gpu_count=1, start=start, end=end,
                                             created_at=start, updated_at=start)
    ReservationGpu.objects.create(reservation=reservation, gpu=gpu, start=start, end=end)
    events = tmp_path / "events.jsonl"
    job_submit(user=user, document={"task_name": "stand-in", "image": "yolo:v8n-cu118", "team": "vision",
                                    "command": [sys.executable, SLOT_RECORDER, str(events)]},
               now=start - dt.timedelta(seconds=6), reservation_id=reservation.pk)

    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and not Run.objects.filter(state__in=["checkpointed", "killed", "failed"]).exists():
        time.sleep(0.2)
    seen = {line["event"]: line["t"] for line in map(json.loads, events.read_text().splitlines())}
    run = Run.objects.get()
    started_late = seen["started"] - start.timestamp()
    sigterm_at = seen["sigterm"] - end.timestamp()
    print(f"start lateness {started_late:.3f} s; SIGTERM at end{sigterm_at:+.3f} s; run {run.state}")
    # Includes the interpreter's own start-up (about 0.05 s), so the scheduler's share is less.
    assert 0 <= started_late < 1.0
    assert -GRACE_S <= sigterm_at < -GRACE_S + 1.0
    assert run.state == Run.State.CHECKPOINTED and run.ended_at < end
