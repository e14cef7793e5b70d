"""Random small snapshots for the queue-estimate golden test, and how a result is recorded.

`random_state(seed)` depends only on `random.Random(seed)`, so the snapshots are the same
wherever the test runs; the golden data (data/queue_estimates_golden.json) holds what
`estimate_starts` answered for them before its roll-forward was made cheaper (commit
fc9ee3c: one plan() per event, up to 500 plans). Re-record only on purpose:
    .venv/bin/python -m tests.scheduler.queue_estimate_cases > tests/scheduler/data/queue_estimates_golden.json
"""

from __future__ import annotations

import json
import random

from scheduler import Priority, TeamAccount
from scheduler.queue_estimates import QueueEstimate, estimate_starts
from tests.scheduler.builders import gpus, job, reservation, run, snapshot

NOW = 100_000.0
SEEDS = range(8)
USERS = {"vision": ("alice", "bob"), "speech": ("carol",), "nlp": ("dave", "erin")}


def random_state(seed: int):
    rng = random.Random(seed)
    nodes = rng.choice([1, 2, 3])
    per_node = 8
    booked: dict[int, list[tuple[float, float]]] = {}
    reservations = []
    for number in range(1, rng.randint(0, 6) + 1):
        node = rng.randrange(nodes)
        members = tuple(sorted(node * 100 + index for index in rng.sample(range(per_node), rng.choice([1, 2, 4, 8]))))
        start = NOW + rng.randrange(-2, 40) * 1800.0
        end = start + rng.randrange(1, 8) * 1800.0
        if end <= NOW or any(s < end and start < e for gpu in members for s, e in booked.get(gpu, ())):
            continue
        for gpu in members:
            booked.setdefault(gpu, []).append((start, end))
        team = rng.choice(sorted(USERS))
        reservations.append(reservation(number, members, start, end, job_id=5000 + number, team=team,
                                        user=USERS[team][0]))
    in_progress = {gpu for item in reservations if item.start <= NOW for gpu in item.gpu_ids}
    free = [node * 100 + index for node in range(nodes) for index in range(per_node)
            if node * 100 + index not in in_progress]
    rng.shuffle(free)
    runs = []
    position = 0
    while position < len(free) * 0.7:
        size = rng.choice([1, 1, 2, 4])
        taken = tuple(sorted(free[position:position + size]))
        position += size
        team = rng.choice(sorted(USERS))
        started = NOW - rng.uniform(0, 20_000)
        runs.append(run(len(runs) + 1, taken, started_at=started, team=team, user=rng.choice(USERS[team]),
                        estimated_end=rng.choice([None, started + rng.uniform(600, 40_000)]),
                        priority=rng.choice(list(Priority)[1:])))
    queued = []
    for number in range(rng.randint(5, 40)):
        team = rng.choice(sorted(USERS))
        queued.append(job(
            100 + number, rng.choice([1, 1, 1, 2, 4, 8]), submitted_at=NOW - rng.uniform(0, 2e5), team=team,
            user=rng.choice(USERS[team]), priority=rng.choice([Priority.LOW, Priority.MEDIUM, Priority.HIGH]),
            estimate_s=rng.choice([None, rng.uniform(60, 30_000)]), checkpointable=rng.random() < 0.7,
        ))
    teams = (TeamAccount("vision", share=2.0), TeamAccount("speech", share=1.0),
             TeamAccount("nlp", share=1.0, quota_remaining_gpu_s=rng.choice([None, 50_000.0, 0.0])))
    return snapshot(gpus=gpus(nodes=nodes, per_node=per_node), reservations=tuple(reservations),
                    runs=tuple(runs), queued_jobs=tuple(queued), teams=teams)


def recorded(estimate: QueueEstimate) -> list:
    """The fields the golden data holds (those that existed before `not_before`)."""
    return [estimate.position, estimate.estimated_start, estimate.wait_reason.value,
            estimate.blocking_reservation_id]


if __name__ == "__main__":
    print(json.dumps({
        str(seed): {str(job_id): recorded(estimate)
                    for job_id, estimate in sorted(estimate_starts(random_state(seed), NOW).items())}
        for seed in SEEDS
    }, indent=1))
