"""Jobs that live across slots (issue #18): how long a long training takes when it is booked
as evening slots, against the same jobs run without bookings, on the trace simulator
(`scheduler.sim`, the very `plan()` reconcile calls).

Scenario (deterministic per seed): 2 nodes × 4 GPUs for three weeks; a background of queued
backfill jobs (Poisson arrivals, 1/2/4 GPUs, log-normal durations with a 2 h median, about
60 % of the cluster by default) and another team's daytime bookings (weekdays 09–17, node 1, whole
node). Four `continuation` jobs of 72 h on 1 GPU, resumable (checkpoint on stop, 2 min to
resume), each booked by its owner as consecutive evening slots 18:00–08:00 on its own GPU of
node 0, as many evenings as the job needs. Three ways to run them, same background:

* `next_booking` (gpubook's default for a job submitted into a booking): between its slots
  the job waits for its next booking and runs nowhere else;
* `then: backfill`: after each slot it also joins the backfill queue (runs on idle GPUs
  between its slots, is stopped again when a booking needs the GPUs);
* **baseline, no bookings**: the same jobs simply queued (backfill) at the first slot's start.

Completion time = from the first slot's start (the baseline's submit) to the job's end;
the background's median wait shows what the long jobs cost the others.

    .venv/bin/python benchmarks/continuation_replay.py [--seeds 1 2 3] [--load 0.6]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scheduler.policy import Policy  # noqa: E402
from scheduler.sim.engine import Booking, SimJob, Simulation, SimulationConfig  # noqa: E402
from scheduler.sim.metrics import percentile  # noqa: E402
from scheduler.sim.workload import make_gpus  # noqa: E402
from scheduler.snapshot import RunKind  # noqa: E402

H = 3600.0
DAY = 24 * H
DAYS = 21
GPUS_PER_NODE = 4
LONG_JOBS = 4
LONG_JOB_S = 72 * H
RESTART_S = 120.0
EVENING = (18 * H, 32 * H)  # 18:00 to 08:00 the next morning
BACKGROUND_LOAD = 0.6
VARIANTS = ("no bookings (baseline)", "next_booking", "then: backfill")


class ContinuationSimulation(Simulation):
    """Jobs with bookings of their own, as gpubook runs them. Two departures from the plain
    engine (which gives every job at most one booking):
    * a job that has finished marks all its bookings finished (gpubook's snapshot: a booking's
      `job_finished` once its job has ended for good), so plan releases the evenings left
      instead of starting the finished job again;
    * with `then: next_booking` (`requeue=False`) a stopped job is not queued for backfill
      between its bookings (the engine alone requeues every stopped job: `then: backfill`).
    """

    def __init__(self, *args, continuing: set[int], requeue: bool, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.continuing = continuing
        self.requeue = requeue

    def _submit(self, job: SimJob, now_s: float) -> None:
        if self.requeue or job.id not in self.continuing:
            super()._submit(job, now_s)

    def _end_run(self, live, now_s: float, how: str) -> None:
        super()._end_run(live, now_s, how)
        if how == "completed" and live.job.id in self.continuing:
            for reservation in list(self.reservations.values()):
                if reservation.job_id == live.job.id and not reservation.job_finished:
                    self.reservations[reservation.id] = replace(reservation, job_finished=True)
                    self._reservations_tuple = None


def background(rng: random.Random, total_gpus: int, load: float) -> list[SimJob]:
    jobs = []
    mean_gpu_s = statistics.fmean([1, 1, 2, 4]) * 2 * H * math.exp(0.8**2 / 2)
    rate = load * total_gpus / mean_gpu_s  # arrivals per second
    t = rng.expovariate(rate)
    while t < (DAYS - 7) * DAY:  # the last week drains
        jobs.append(SimJob(
            id=1000 + len(jobs), user=f"bg{len(jobs) % 7}", team="others", gpus=rng.choice([1, 1, 2, 4]),
            submit_s=t, duration_s=min(24 * H, 2 * H * math.exp(rng.gauss(0, 0.8))),
            checkpointable=rng.random() < 0.75,
        ))
        t += rng.expovariate(rate)
    return jobs


def daytime_bookings(first_id: int) -> list[tuple[SimJob, Booking]]:
    """Another team's weekday bookings of node 1 (09–17), each running a 7 h job."""
    made = []
    for day in range(DAYS - 7):
        if day % 7 >= 5:
            continue
        job_id, start_s = first_id + day, day * DAY + 9 * H
        job = SimJob(id=job_id, user="lab", team="lab", gpus=GPUS_PER_NODE, submit_s=start_s,
                     duration_s=7 * H, booking_id=job_id)
        made.append((job, Booking(id=job_id, job_id=job_id, gpu_ids=tuple(range(4, 8)), start_s=start_s,
                                  end_s=start_s + 8 * H, booked_at_s=0.0, team="lab", user="lab")))
    return made


def long_jobs(policy: Policy, *, booked: bool, first_booking_id: int) -> tuple[list[SimJob], list[Booking]]:
    jobs, bookings = [], []
    slot_s = EVENING[1] - EVENING[0]
    # Each evening gives the slot less the stop's grace and the resume; the owner books enough.
    nights = math.ceil(LONG_JOB_S / (slot_s - policy.grace_s - RESTART_S))
    for number in range(LONG_JOBS):
        job_id = number + 1
        start_s = EVENING[0] + (number // 2) * DAY  # two owners start on the first evening, two on the next
        job = SimJob(id=job_id, user=f"cv{number}", team="cv", gpus=1, submit_s=start_s, duration_s=LONG_JOB_S,
                     checkpointable=True)
        if booked:
            for night in range(nights):
                booking_id = first_booking_id + number * 100 + night
                bookings.append(Booking(
                    id=booking_id, job_id=job_id, gpu_ids=(number,), start_s=start_s + night * DAY,
                    end_s=start_s - EVENING[0] + night * DAY + EVENING[1], booked_at_s=0.0, team="cv", user=job.user,
                ))
            job.booking_id = first_booking_id + number * 100
        jobs.append(job)
    return jobs, bookings


def replay(variant: str, seed: int, load: float) -> dict:
    policy = Policy()
    rng = random.Random(seed)
    gpus = make_gpus(2 * GPUS_PER_NODE, GPUS_PER_NODE)
    others = background(rng, len(gpus), load)
    lab = daytime_bookings(first_id=500)
    mine, my_bookings = long_jobs(policy, booked=variant != VARIANTS[0], first_booking_id=10_000)
    jobs = others + [job for job, _ in lab] + mine
    bookings = [booking for _, booking in lab] + my_bookings
    config = SimulationConfig(
        gpus=gpus, policy=policy, restart_overhead_s=RESTART_S,
        team_quota_gpu_s={"others": 1.0, "lab": 1.0, "cv": 1.0},
    )
    if variant == VARIANTS[0]:
        simulation = Simulation(config, jobs, bookings)
    else:
        simulation = ContinuationSimulation(
            config, jobs, bookings, continuing={job.id for job in mine}, requeue=variant == "then: backfill"
        )
    started = time.perf_counter()
    result = simulation.run()
    elapsed = time.perf_counter() - started
    runs = [record for record in result.run_records if record.job_id <= LONG_JOBS]
    if variant == "next_booking":  # the override took: no continuation job ran outside its bookings
        assert all(record.kind == RunKind.RESERVED for record in runs), "a next_booking job was backfilled"
    # Each job completes once (a finished job's later bookings are released, not run again).
    assert sorted(record.job_id for record in runs if record.how == "completed") == [job.id for job in mine]
    completion_h = [
        (job.completed_s - job.submit_s) / H if job.completed_s is not None else math.inf for job in mine
    ]
    waits_h = [(job.first_start_s - job.submit_s) / H for job in others if job.first_start_s is not None]
    return {
        "completion_h": completion_h, "runs": len(runs),
        "background_wait_h": statistics.median(waits_h), "background_p90_h": percentile(waits_h, 0.9),
        "seconds": elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--load", type=float, default=BACKGROUND_LOAD, help="the background's share of the GPUs")
    arguments = parser.parse_args()
    seeds, load = arguments.seeds, arguments.load
    print(f"{LONG_JOBS} jobs of {LONG_JOB_S / H:.0f} h on 1 GPU; 8 GPUs; background load {load:.0%}; "
          f"seeds {seeds}")
    print("| variant | completion median (h) | completion max (h) | × the job's 72 h | runs per job "
          "| background wait median / p90 (h) | sim seconds |")
    print("|---|---|---|---|---|---|---|")
    baseline = None
    for variant in VARIANTS:
        rows = [replay(variant, seed, load) for seed in seeds]
        completion = [hours for row in rows for hours in row["completion_h"]]
        median = statistics.median(completion)
        baseline = baseline or median
        print(f"| {variant} | {median:.1f} | {max(completion):.1f} | {median / (LONG_JOB_S / H):.2f} "
              f"| {statistics.fmean(row['runs'] for row in rows) / LONG_JOBS:.1f} "
              f"| {statistics.fmean(row['background_wait_h'] for row in rows):.2f} / "
              f"{statistics.fmean(row['background_p90_h'] for row in rows):.2f} "
              f"| {sum(row['seconds'] for row in rows):.1f} |")
        if variant != VARIANTS[0]:
            print(f"|   ratio to the baseline's median completion | {median / baseline:.2f} | | | | | |")


if __name__ == "__main__":
    main()
