"""Cost of one `scheduler.plan()` call on a large, busy snapshot, and how it scales.

Base: 1,024 GPUs (128 nodes of 8), 5,000 queued jobs, 2,000 reservations, ~85 % of GPUs
busy. Doubled: every input twice as large. Goal: median ≤ 50 ms at base and ≤ 2.2× when
doubled. Each call gets freshly built tuples, so plan's identity memos (topology,
reservation index) never hit: this is the cost of a cold reconcile tick.

    .venv/bin/python benchmarks/scheduler_plan.py
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler import (
    Gpu,
    Policy,
    Priority,
    QueuedJob,
    Reservation,
    Run,
    RunKind,
    Snapshot,
    Start,
    TeamAccount,
    Usage,
    plan,
)

GPUS_PER_NODE = 8
SLOT_S = 1800.0
NOW = 30 * 86400.0
REPEATS = 15


def build_snapshot(gpu_count: int, queued: int, reservations: int, seed: int) -> Snapshot:
    rng = random.Random(seed)
    gpus = tuple(
        Gpu(id=number, node=number // GPUS_PER_NODE, index=number % GPUS_PER_NODE)
        for number in range(gpu_count)
    )
    nodes = gpu_count // GPUS_PER_NODE
    teams = [f"team{number}" for number in range(12)]
    users = [f"user{number}" for number in range(150)]

    # Reservations over the next week, slot-aligned, non-overlapping per GPU; some now.
    booked: dict[int, list[tuple[float, float]]] = {}
    reservation_list: list[Reservation] = []
    attempts = 0
    while len(reservation_list) < reservations and attempts < reservations * 50:
        attempts += 1
        node = rng.randrange(nodes)
        size = rng.choice([1, 1, 2, 4, 8])
        members = rng.sample(range(GPUS_PER_NODE), size)
        gpu_ids = tuple(sorted(node * GPUS_PER_NODE + index for index in members))
        start = NOW + rng.randrange(-4, 7 * 48) * SLOT_S
        end = start + rng.randrange(1, 12) * SLOT_S
        if end <= NOW:
            continue
        if any(s < end and start < e for gpu in gpu_ids for s, e in booked.get(gpu, ())):
            continue
        for gpu in gpu_ids:
            booked.setdefault(gpu, []).append((start, end))
        reservation_list.append(
            Reservation(
                id=len(reservation_list) + 1, gpu_ids=gpu_ids, start=start, end=end,
                team=rng.choice(teams), user=rng.choice(users), job_id=10**7 + attempts,
            )
        )

    # Runs on ~85 % of the GPUs not reserved now; reserved slots in progress have theirs.
    in_progress = {
        gpu: item for item in reservation_list if item.start <= NOW < item.end
        for gpu in item.gpu_ids
    }
    runs: list[Run] = []
    for item in reservation_list:
        if item.start <= NOW < item.end and rng.random() < 0.9:
            runs.append(
                Run(id=len(runs) + 1, job_id=item.job_id, gpu_ids=item.gpu_ids,
                    kind=RunKind.RESERVED, started_at=item.start, team=item.team,
                    user=item.user, reservation_id=item.id, must_end_by=item.end)
            )
    free = [gpu.id for gpu in gpus if gpu.id not in in_progress]
    rng.shuffle(free)
    busy_target = int(len(free) * 0.85)
    position = 0
    while position < busy_target:
        size = min(rng.choice([1, 1, 1, 2, 4]), busy_target - position)
        taken = tuple(sorted(free[position : position + size]))
        position += size
        started = NOW - rng.uniform(0, 20_000)
        runs.append(
            Run(id=len(runs) + 1, job_id=2 * 10**7 + len(runs), gpu_ids=taken,
                kind=RunKind.BACKFILL, started_at=started, team=rng.choice(teams),
                user=rng.choice(users), must_end_by=None,
                estimated_end=started + rng.uniform(600, 40_000))
        )

    queued_jobs = tuple(
        QueuedJob(
            id=number + 1, team=rng.choice(teams), user=rng.choice(users),
            gpus_needed=rng.choice([1, 1, 1, 1, 2, 4, 8]), submitted_at=NOW - rng.uniform(0, 3e5),
            priority=rng.choice([Priority.LOW, Priority.MEDIUM, Priority.MEDIUM, Priority.HIGH]),
            estimated_duration_s=rng.choice([None, rng.uniform(60, 90_000)]),
            checkpointable=rng.random() < 0.75,
        )
        for number in range(queued)
    )
    usage = tuple(
        Usage(team=rng.choice(teams), user=user, gpu_seconds=rng.uniform(0, 5e6), as_of=NOW - 60)
        for user in users
    )
    accounts = tuple(TeamAccount(team=team, share=rng.uniform(1, 5)) for team in teams)
    return Snapshot(gpus=gpus, reservations=tuple(reservation_list), queued_jobs=queued_jobs,
                    runs=tuple(runs), usage=usage, teams=accounts)


def fresh_copy(snapshot: Snapshot) -> Snapshot:
    """Same contents, new tuple objects: defeats plan's identity memos."""
    return Snapshot(
        gpus=tuple(list(snapshot.gpus)), reservations=tuple(list(snapshot.reservations)),
        queued_jobs=tuple(list(snapshot.queued_jobs)), runs=tuple(list(snapshot.runs)),
        usage=tuple(list(snapshot.usage)), teams=tuple(list(snapshot.teams)),
    )


def measure(snapshot: Snapshot, policy: Policy) -> tuple[float, int]:
    plan(fresh_copy(snapshot), NOW, policy)  # warm-up (imports, first allocations)
    timings = []
    for _ in range(REPEATS):
        copy = fresh_copy(snapshot)
        started = time.perf_counter()
        actions = plan(copy, NOW, policy)
        timings.append(time.perf_counter() - started)
    return statistics.median(timings), len(actions)


def main() -> int:
    policy = Policy()
    rows = []
    for label, factor in (("base", 1), ("doubled", 2)):
        snapshot = build_snapshot(1024 * factor, 5000 * factor, 2000 * factor, seed=factor)
        busy = sum(len(run.gpu_ids) for run in snapshot.runs)
        median_s, action_count = measure(snapshot, policy)
        starts = sum(1 for action in plan(fresh_copy(snapshot), NOW, policy)
                     if isinstance(action, Start))
        rows.append((label, snapshot, busy, median_s, action_count, starts))
        print(
            f"{label:>8}: {len(snapshot.gpus):>5} GPUs ({busy} busy), "
            f"{len(snapshot.queued_jobs):>6} queued, {len(snapshot.reservations):>5} "
            f"reservations, {len(snapshot.runs):>5} runs -> plan() median "
            f"{median_s * 1000:6.1f} ms over {REPEATS} calls ({action_count} actions, "
            f"{starts} starts)"
        )
    ratio = rows[1][3] / rows[0][3]
    print(f"doubled / base = {ratio:.2f}x (goal <= 2.2x); base goal <= 50 ms: "
          f"{'met' if rows[0][3] <= 0.050 else 'NOT met'}; ratio goal: "
          f"{'met' if ratio <= 2.2 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
