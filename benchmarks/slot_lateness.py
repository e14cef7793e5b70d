"""Slot-edge lateness with the production stack: a real Celery worker + beat, Redis,
PostgreSQL and the local executor. N one-GPU reservations with a stand-in job each start
one second apart; each job writes the moment it started and the moment SIGTERM came.

    .venv/bin/python benchmarks/slot_lateness.py [--slots 24]

Start lateness = started − slot start (includes the stand-in interpreter's own start-up).
Stop lateness = SIGTERM − (end − grace): the stop is due `grace` before the end.
Baseline (printed alongside): the beat interval alone, i.e. the lateness a scheduler without
the ETA task would have on average (half a tick) and at worst (a whole tick).
"""

import argparse
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
from _support import ROOT, django_on, fresh_database, percentile

DATABASE = "gpubook_bench_slots"
REDIS_URL = "redis://127.0.0.1:6379/8"
TICK_S, GRACE_S, SLOT_S = 5, 3, 8
SLOT_RECORDER = str(ROOT / "tests" / "fakes" / "slot_recorder.py")  # logs start and SIGTERM times


def start_celery(env: dict, workdir: Path) -> list[subprocess.Popen]:
    celery = [sys.executable, "-m", "celery", "-A", "config"]
    worker_log = workdir / "worker.log"
    with open(worker_log, "w") as log:
        worker = subprocess.Popen([*celery, "worker", "--pool=solo", "-l", "info", "--without-gossip",
                                   "--without-mingle"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                  start_new_session=True)
    with open(workdir / "beat.log", "w") as log:
        beat = subprocess.Popen([*celery, "beat", "-l", "info", "-s", str(workdir / "beat-schedule")], env=env,
                                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    deadline = time.monotonic() + 60
    while "ready." not in worker_log.read_text():
        if time.monotonic() > deadline or worker.poll() is not None:
            raise RuntimeError(worker_log.read_text())
        time.sleep(0.1)
    return [beat, worker]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slots", type=int, default=24)
    args = parser.parse_args(argv)
    url = fresh_database(DATABASE)
    redis.Redis.from_url(REDIS_URL).flushdb()
    workdir = Path(tempfile.mkdtemp(prefix="gpubook-slots-"))
    env = {**os.environ, "DATABASE_URL": url, "REDIS_URL": REDIS_URL, "SECRET_KEY": "bench", "DEBUG": "false",
           "GPUBOOK_VAR_DIR": str(workdir / "var"), "GPUBOOK_TICK_SECONDS": str(TICK_S),
           "GPUBOOK_STOP_GRACE_SECONDS": str(GRACE_S),
           # Its jobs are bare commands run by the local executor: the single-workstation mode
           # (a shared server refuses command jobs unless GPUBOOK_JOB_USER is set).
           "GPUBOOK_SINGLE_USER": "true"}
    django_on(url, GPUBOOK_VAR_DIR=str(workdir / "var"), GPUBOOK_SINGLE_USER="true")
    from django.contrib.auth import get_user_model

    from gpus.models import Gpu, Node
    from reservations.models import Membership, Reservation, ReservationGpu, Team
    from training.models import Run
    from training.services import job_submit

    node = Node.objects.create(name="bench-node")
    team = Team.objects.create(name="bench", slug="bench", monthly_gpu_hours=10_000)
    user = get_user_model().objects.create_user(username="bench")
    Membership.objects.create(team=team, user=user)
    processes = start_celery(env, workdir)
    try:
        first = int(time.time()) + 8
        slots = []
        for number in range(args.slots):
            gpu = Gpu.objects.create(node=node, index=number, model_name="bench", memory_mib=1)
            start = dt.datetime.fromtimestamp(first + number, tz=dt.UTC)
            end = start + dt.timedelta(seconds=SLOT_S)
            reservation = Reservation.objects.create(user=user, team=team, node=node, gpu_count=1, start=start,
                                                     end=end, created_at=start, updated_at=start)
            ReservationGpu.objects.create(reservation=reservation, gpu=gpu, start=start, end=end)
            events = workdir / f"slot-{number}.jsonl"
            job_submit(user=user, now=start - dt.timedelta(seconds=10), reservation_id=reservation.pk,
                       document={"task_name": f"slot {number}", "image": "yolo:v8n-cu118", "team": "bench",
                                 "command": [sys.executable, SLOT_RECORDER, str(events)]})
            slots.append((start, end, events))
        deadline = time.monotonic() + first + args.slots + SLOT_S + 30 - time.time()
        while time.monotonic() < deadline:
            if Run.objects.count() == args.slots and not Run.objects.filter(state__in=Run.LIVE).exists():
                break
            time.sleep(0.5)
    finally:
        for process in processes:
            os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            process.wait(timeout=30)
    start_late, stop_late, missing = [], [], 0
    for start, end, events in slots:
        if not events.exists():
            missing += 1
            continue
        seen = {line["event"]: line["t"] for line in map(json.loads, events.read_text().splitlines())}
        if "started" not in seen or "sigterm" not in seen:
            missing += 1
            continue
        start_late.append(seen["started"] - start.timestamp())
        stop_late.append(seen["sigterm"] - (end.timestamp() - GRACE_S))
    print(f"slot lateness over {len(start_late)} slots (missing {missing}); beat tick {TICK_S} s, grace {GRACE_S} s")
    for name, values in (("start", start_late), ("stop ", stop_late)):
        print(f"  {name}: p50 {1000 * percentile(values, 0.5):.0f} ms, p99 {1000 * percentile(values, 0.99):.0f} ms, "
              f"max {1000 * max(values):.0f} ms, min {1000 * min(values):.0f} ms")
    print(f"  baseline (beat tick only, no ETA): mean {1000 * TICK_S / 2:.0f} ms, worst {1000 * TICK_S:.0f} ms; "
          f"ratio p99/baseline-worst {percentile(start_late, 0.99) / TICK_S:.2f}")
    return 0 if missing == 0 and percentile(start_late, 0.99) <= 1.0 and percentile(stop_late, 0.99) <= 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
