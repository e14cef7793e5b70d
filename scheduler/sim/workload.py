"""Turning a job trace into a simulated workload: queued jobs and calendar bookings.

Pure and deterministic for a given seed. The choices, all reported by the simulator:
* **Bookings**: a `reservation_share` fraction of the trace's GPU-hours arrive as calendar
  bookings. Candidates are jobs that fit on one node (a reservation is GPUs of one node);
  they are visited in an order shuffled by the seed and taken while the booked GPU-hours stay
  within the target. A booking starts at the job's submit time rounded up to the slot and
  lasts the job's duration plus the grace period, rounded up to whole slots (a user books
  what the job needs; if it finishes early the rest is released). It is made 1–48 hours
  ahead (uniform, by seed). The simulated booking service places it on the first node (in
  node order) with enough GPUs free for the whole slot; if none, the user takes the next
  slot, up to `MAX_BOOKING_SHIFT_S` later; after that the job is queued instead.
* **Checkpointable**: a job is checkpointable with probability `CHECKPOINTABLE_SHARE`, by
  seed (gpubook's YOLO runner checkpoints on SIGTERM; other images may not).
* **Teams**: the trace's `group` (VC); an empty group becomes the team "unassigned".
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass

from scheduler.sim.engine import Booking, SimJob
from scheduler.sim.trace import TraceJob
from scheduler.snapshot import Gpu, Id

CHECKPOINTABLE_SHARE = 0.75
BOOKING_LEAD_MIN_S = 3600.0
BOOKING_LEAD_MAX_S = 48 * 3600.0
MAX_BOOKING_SHIFT_S = 7 * 86400.0
UNASSIGNED_TEAM = "unassigned"


@dataclass(frozen=True, slots=True)
class Workload:
    jobs: tuple[SimJob, ...]
    bookings: tuple[Booking, ...]
    booking_target_gpu_s: float
    booked_gpu_s: float
    bookings_shifted: int
    bookings_refused: int


def make_gpus(total_gpus: int, gpus_per_node: int) -> tuple[Gpu, ...]:
    """`total_gpus` GPUs on nodes of `gpus_per_node` (the last node may be smaller)."""
    return tuple(
        Gpu(id=number, node=number // gpus_per_node, index=number % gpus_per_node)
        for number in range(total_gpus)
    )


class _Calendar:
    """Booked intervals per GPU, for the simulated booking service (no overlap, ever)."""

    def __init__(self, gpus: tuple[Gpu, ...]) -> None:
        self.nodes: dict[Id, list[Id]] = {}
        for gpu in gpus:
            self.nodes.setdefault(gpu.node, []).append(gpu.id)
        self.starts: dict[Id, list[float]] = {gpu.id: [] for gpu in gpus}
        self.ends: dict[Id, list[float]] = {gpu.id: [] for gpu in gpus}

    def is_free(self, gpu_id: Id, start_s: float, end_s: float) -> bool:
        starts = self.starts[gpu_id]
        position = bisect.bisect_left(starts, end_s)
        # The interval starting before our end with the latest start must end by our start.
        return position == 0 or self.ends[gpu_id][position - 1] <= start_s

    def book(self, gpus_needed: int, start_s: float, end_s: float) -> tuple[Id, ...] | None:
        for gpu_ids in self.nodes.values():
            free = [gpu_id for gpu_id in gpu_ids if self.is_free(gpu_id, start_s, end_s)]
            if len(free) >= gpus_needed:
                chosen = tuple(free[:gpus_needed])
                for gpu_id in chosen:
                    position = bisect.bisect_left(self.starts[gpu_id], start_s)
                    self.starts[gpu_id].insert(position, start_s)
                    self.ends[gpu_id].insert(position, end_s)
                return chosen
        return None


def build_workload(
    trace: list[TraceJob],
    *,
    gpus: tuple[Gpu, ...],
    gpus_per_node: int,
    reservation_share: float,
    slot_s: float,
    grace_s: float,
    seed: int,
) -> Workload:
    rng = random.Random(seed)
    checkpointable = {job.job_id: rng.random() < CHECKPOINTABLE_SHARE for job in trace}
    total_gpu_s = sum(job.gpus * job.duration_s for job in trace)
    target_gpu_s = reservation_share * total_gpu_s

    candidates = [job for job in trace if job.gpus <= gpus_per_node]
    rng.shuffle(candidates)
    chosen: list[TraceJob] = []
    chosen_gpu_s = 0.0
    for job in candidates:
        job_gpu_s = job.gpus * job.duration_s
        if chosen_gpu_s + job_gpu_s <= target_gpu_s:
            chosen.append(job)
            chosen_gpu_s += job_gpu_s
    leads = {job.job_id: rng.uniform(BOOKING_LEAD_MIN_S, BOOKING_LEAD_MAX_S) for job in chosen}

    calendar = _Calendar(gpus)
    bookings: list[Booking] = []
    booked_job_ids: dict[int, int] = {}
    shifted = refused = 0
    booked_gpu_s = 0.0
    chosen.sort(key=lambda job: (job.submit_s - leads[job.job_id], job.job_id))
    for job in chosen:
        desired_start_s = math.ceil(job.submit_s / slot_s) * slot_s
        length_s = math.ceil((job.duration_s + grace_s) / slot_s) * slot_s
        booked_at_s = job.submit_s - leads[job.job_id]
        start_s = desired_start_s
        gpu_ids = None
        while start_s <= desired_start_s + MAX_BOOKING_SHIFT_S:
            gpu_ids = calendar.book(job.gpus, start_s, start_s + length_s)
            if gpu_ids is not None:
                break
            start_s += slot_s
        if gpu_ids is None:
            refused += 1
            continue
        shifted += start_s != desired_start_s
        booking_id = len(bookings) + 1
        team = job.group or UNASSIGNED_TEAM
        bookings.append(
            Booking(
                id=booking_id,
                job_id=job.job_id,
                gpu_ids=gpu_ids,
                start_s=start_s,
                end_s=start_s + length_s,
                booked_at_s=booked_at_s,
                team=team,
                user=job.user,
            )
        )
        booked_job_ids[job.job_id] = booking_id
        booked_gpu_s += job.gpus * job.duration_s

    jobs = []
    for job in trace:
        booking_id = booked_job_ids.get(job.job_id)
        submit_s = job.submit_s
        if booking_id is not None:
            # The job exists from its booked start on; waits are measured from there.
            submit_s = bookings[booking_id - 1].start_s
        jobs.append(
            SimJob(
                id=job.job_id,
                user=job.user,
                team=job.group or UNASSIGNED_TEAM,
                gpus=job.gpus,
                submit_s=submit_s,
                duration_s=job.duration_s,
                checkpointable=checkpointable[job.job_id],
                booking_id=booking_id,
            )
        )
    return Workload(
        jobs=tuple(jobs),
        bookings=tuple(bookings),
        booking_target_gpu_s=target_gpu_s,
        booked_gpu_s=booked_gpu_s,
        bookings_shifted=shifted,
        bookings_refused=refused,
    )
