"""The scheduler tick at cluster scale (issue #19 item 2), on PostgreSQL.

    .venv/bin/python benchmarks/tick_scale.py [--scales 1,2] [--ticks 12]

Builds, through the services (bookings with `reservation_create`, jobs with `job_submit`,
runs started by reconcile itself): 512 GPUs (64 nodes × 8), 1,000 bookings over the next
week, 300 running runs, 2,000 queued jobs (told they wait), plus a month of history — finished
jobs and runs and their notices, written with bulk_create as the past would have left them.
The executor answers instantly (tests/fakes/executor.py). GPUs no run holds are drained, so a
tick has nothing to start: that is the no-op tick. Then:

- no-op `reconcile` tick: median time and statements (goal <= 150 ms, <= 30);
- the whole loop tick (`scheduler_tick`: reconcile, watchdog, metrics): median (goal <= 250 ms);
- a tick that starts 50 runs (50 drained GPUs come back): median of 3 (goal <= 600 ms);
- the same at every input doubled (`--scales 1,2`): each figure's ratio (goal <= 2.2x).

The clock moves 5 s per tick, so one tick in six also refreshes the queue estimates
(GPUBOOK_QUEUE_ESTIMATE_SECONDS = 30): the max column shows that tick. Baseline in the same
run: `plan()` alone on the same snapshot (the pure scheduler's share of a tick).
Uses its own database (gpubook_bench_tick), dropped and recreated per scale.
"""

import argparse
import datetime as dt
import os
import statistics
import sys
import time

from _support import ROOT, SERVER, django_on, fresh_database

DATABASE = "gpubook_bench_tick"
NOW = dt.datetime(2031, 3, 3, 9, 0, tzinfo=dt.UTC)
H = dt.timedelta(hours=1)
TEAMS, USERS_PER_TEAM, GPUS_PER_NODE = 8, 4, 8


def build(scale: int):
    """The cluster at `scale` (1 = the issue's sizes). Returns (executor, teams, users)."""
    sys.path.insert(0, str(ROOT))
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from gpus.models import Gpu, Node
    from notifications.models import Notice
    from reservations.models import Membership, Team
    from reservations.services import reservation_create
    from tests.fakes.executor import FakeExecutor
    from training.models import Run, TrainingImage, TrainingJob
    from training.reconcile import reconcile
    from training.services import job_submit

    began = time.perf_counter()
    TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")
    nodes = [Node.objects.create(name=f"n{number:03d}") for number in range(64 * scale)]
    gpus = Gpu.objects.bulk_create(
        Gpu(node=node, index=index, model_name="A100", memory_mib=81920)
        for node in nodes for index in range(GPUS_PER_NODE)
    )
    teams = [Team.objects.create(name=f"team{n}", slug=f"team{n}", monthly_gpu_hours=10**6, max_days_ahead=3650)
             for n in range(TEAMS)]
    users = []
    for team in teams:
        for number in range(USERS_PER_TEAM):
            user = get_user_model().objects.create_user(username=f"{team.slug}-u{number}",
                                                        email=f"{team.slug}-u{number}@lab.example")
            Membership.objects.create(team=team, user=user)
            users.append((user, team))

    # Bookings: 1,000 × scale over the week after the next 6 hours, 1 GPU × 2 h each.
    for number in range(1000 * scale):
        user, team = users[number % len(users)]
        gpu = gpus[number % len(gpus)]
        start = NOW + 6 * H + (number // len(gpus)) * 3 * H + (number % 7) * 24 * H
        reservation_create(user=user, team=team, gpu_ids=[gpu.pk], start=start, end=start + 2 * H,
                           now=NOW - 24 * H)

    def submit(count: int, at: dt.datetime, prefix: str) -> None:
        for number in range(count):
            user, team = users[number % len(users)]
            job_submit(user=user, now=at, document={
                "task_name": f"{prefix} {number}", "image": "yolo:v8n-cu118", "team": team.slug,
                "command": [sys.executable, "-c", "pass"], "checkpointable": True,
            })

    # 300 × scale runs, started by reconcile itself.
    executor = FakeExecutor()
    submit(300 * scale, NOW - 2 * H, "running")
    first = time.perf_counter()
    reconcile(now=NOW - H, executor=executor)
    first_tick = time.perf_counter() - first
    running = Run.objects.filter(state__in=Run.LIVE).count()
    held = {gpu_id for gpu_ids in Run.objects.filter(state__in=Run.LIVE).values_list("gpu_ids", flat=True)
            for gpu_id in gpu_ids}
    Gpu.objects.exclude(pk__in=held).update(state=Gpu.State.DRAINED)  # nothing else can start

    submit(2000 * scale, NOW - 4 * H, "queued")

    # A month of history: finished jobs and runs and their notices, as the past left them.
    template = TrainingJob.objects.filter(state=TrainingJob.State.QUEUED).first()
    node = nodes[0]
    with transaction.atomic():
        past_jobs = TrainingJob.objects.bulk_create(
            TrainingJob(
                team_id=template.team_id, user_id=template.user_id, name=f"past {number}", image_id=template.image_id,
                spec=template.spec, parsed_spec=template.parsed_spec, argv=template.argv,
                state=TrainingJob.State.SUCCEEDED, submitted_at=NOW - dt.timedelta(days=30) + number * 2 * H / scale,
                finished_at=NOW - dt.timedelta(days=30) + (number * 2 + 1) * H / scale, waiting_for="",
            )
            for number in range(360 * scale)
        )
        Run.objects.bulk_create(
            Run(job=job, kind=Run.Kind.BACKFILL, node=node, gpu_ids=[gpus[0].pk], gpu_indices=[0],
                state=Run.State.SUCCEEDED, exit_code=0, created_at=job.submitted_at, started_at=job.submitted_at,
                ended_at=job.finished_at, must_end_by=job.finished_at + H)
            for job in past_jobs
        )
        Notice.objects.bulk_create(
            Notice(event_type="run.finished", team_id=template.team_id, occurred_at=job.finished_at,
                   payload={"job": {"id": job.pk}})
            for job in past_jobs for _ in range(10)
        )
    print(f"  built scale {scale}: {len(gpus)} GPUs, {1000 * scale} bookings, {running} running runs, "
          f"{2000 * scale} queued jobs, {len(past_jobs)} past runs, {10 * len(past_jobs)} past notices "
          f"in {time.perf_counter() - began:.0f} s (the tick that started the runs: {first_tick * 1000:.0f} ms)")
    return executor


def measure(function, ticks: int) -> tuple[list[float], list[int]]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    times, statements = [], []
    for number in range(ticks):
        with CaptureQueriesContext(connection) as captured:
            began = time.perf_counter()
            function(number)
            times.append(time.perf_counter() - began)
        statements.append(len(captured.captured_queries))
    return times, statements


def run_scale(scale: int, ticks: int) -> dict[str, float]:
    import scheduler
    from config.scheduling import policy_from_settings
    from gpus.models import Gpu
    from training.loop import scheduler_tick
    from training.models import Run
    from training.reconcile import reconcile
    from training.snapshot import build_snapshot

    executor = build(scale)
    clock = {"now": NOW}

    def tick(_number: int, *, whole: bool = False) -> None:
        clock["now"] += dt.timedelta(seconds=5)
        if whole:
            scheduler_tick(now=clock["now"], executor=executor)
        else:
            report = reconcile(now=clock["now"], executor=executor)
            assert not report.started and not report.errors, report

    tick(0)  # the queued jobs are told they wait (once); every later tick is a no-op
    figures = {}
    times, statements = measure(tick, ticks)
    figures["no-op reconcile tick"] = statistics.median(times)
    print(f"  no-op reconcile tick: median {statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms, "
          f"statements median {statistics.median(statements):.0f} (max {max(statements)})")
    times, statements = measure(lambda number: tick(number, whole=True), ticks)
    figures["whole loop tick"] = statistics.median(times)
    print(f"  whole loop tick (reconcile + watchdog + metrics): median {statistics.median(times) * 1000:.0f} ms, "
          f"max {max(times) * 1000:.0f} ms, statements median {statistics.median(statements):.0f}")

    policy = policy_from_settings()
    snapshot = build_snapshot(now=clock["now"], policy=policy)
    plan_times = []
    for _ in range(5):
        began = time.perf_counter()
        scheduler.plan_detailed(snapshot, clock["now"], policy)
        plan_times.append(time.perf_counter() - began)
    figures["plan() alone"] = statistics.median(plan_times)
    print(f"  baseline: plan() alone on the same snapshot: median {statistics.median(plan_times) * 1000:.0f} ms")

    def start_fifty(_number: int) -> None:
        drained = list(Gpu.objects.filter(state=Gpu.State.DRAINED).order_by("pk").values_list("pk", flat=True)[:50])
        Gpu.objects.filter(pk__in=drained).update(state=Gpu.State.ACTIVE)
        clock["now"] += dt.timedelta(seconds=5)
        began_live = Run.objects.filter(state__in=Run.LIVE).count()
        started = time.perf_counter()
        report = reconcile(now=clock["now"], executor=executor)
        timings.append(time.perf_counter() - started)
        assert len(report.started) == 50 and Run.objects.filter(state__in=Run.LIVE).count() == began_live + 50, report

    timings: list[float] = []
    _, statements = measure(start_fifty, 3)
    figures["tick that starts 50 runs"] = statistics.median(timings)
    print(f"  tick that starts 50 runs: median {statistics.median(timings) * 1000:.0f} ms "
          f"(statements median {statistics.median(statements):.0f}, i.e. {statistics.median(statements) / 50:.1f} "
          f"per start including the GPU updates)")
    return figures


GOALS = {"no-op reconcile tick": 0.150, "whole loop tick": 0.250, "tick that starts 50 runs": 0.600}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scales", default="1,2")
    parser.add_argument("--ticks", type=int, default=12)
    args = parser.parse_args(argv)
    scales = [int(value) for value in args.scales.split(",")]
    os.environ.setdefault("GPUBOOK_QUEUE_WAIT_NOTICE_MINUTES", "60")
    results = {}
    for scale in scales:
        fresh_database(DATABASE)
        if scale == scales[0]:
            django_on(f"{SERVER}/{DATABASE}", GPUBOOK_NOTIFY_ENQUEUE="false", GPUBOOK_SINGLE_USER="true")
        else:
            from django.db import connections

            connections.close_all()
        print(f"scale {scale}:")
        results[scale] = run_scale(scale, args.ticks)
    base = results[scales[0]]
    for name, goal in GOALS.items():
        verdict = "met" if base[name] <= goal else "NOT met"
        print(f"{name}: {base[name] * 1000:.0f} ms at scale {scales[0]} (goal <= {goal * 1000:.0f} ms: {verdict})")
        for scale in scales[1:]:
            ratio = results[scale][name] / base[name]
            print(f"  x{scale} inputs: {results[scale][name] * 1000:.0f} ms = {ratio:.2f}x "
                  f"(goal <= 2.2x: {'met' if ratio <= 2.2 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
