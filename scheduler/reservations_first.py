"""Policy: reservations first.

Rule:
* A confirmed reservation owns its GPUs for `[start, end)`. Any run on those GPUs that is
  not the reservation's own must be gone by `start`: its deadline becomes `start`, so
  slot_end asks it to stop `grace` seconds early (`start - grace`) and kills it at `start`
  if it is still there. A backfill run cannot tell it is in the way, so this check looks at
  every live reservation on its GPUs, including ones booked after the run started.
* When the slot has begun, the reservation has an attached job that has not finished, that
  job is not already running, every reserved GPU is active and free, and more than `grace`
  is left, the job starts on all the reserved GPUs with `must_end_by = end` (a `reserved`
  run). A job that checkpointed at the end of an earlier slot resumes the same way in its
  next slot: a new run of the same job.
* Reservations are visited in (start, id) order.

A reservation booked less than `grace` before its start cannot have its GPUs cleared with
full notice: the run in the way gets a Stop with the time that is left (or, if the start
has passed, a Kill at once), because the booking's start time is the product's promise.
The booking service should refuse such late bookings on busy GPUs.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler.actions import Start
from scheduler.index import ReservationIndex, Topology
from scheduler.policy import Policy
from scheduler.snapshot import GpuState, Id, Instant, Run, RunKind


def clearing_deadline_s(run: Run, index: ReservationIndex) -> float:
    """When `run` must be gone to leave every other reservation's GPUs free at its start."""
    own = run.reservation_id if run.kind == RunKind.RESERVED else None
    return index.earliest_foreign_start(run.gpu_ids, own)


def start_reserved_runs(
    *,
    index: ReservationIndex,
    runs_by_reservation: dict[Id, Run],
    occupied: dict[Id, Id],
    running_jobs: set[Id],
    topology: Topology,
    now_s: float,
    policy: Policy,
    to_instant: Callable[[float], Instant],
    wakeups: list[float],
) -> list[Start]:
    # A future start is when a reserved job must launch; an end frees GPUs for backfill.
    wakeups.append(index.earliest_future_start_s)
    wakeups.append(index.earliest_end_s)
    starts = []
    gpu_by_id = topology.gpu_by_id
    for item in index.in_progress:
        reservation = item.reservation
        if (
            reservation.job_id is None
            or reservation.job_finished
            or reservation.id in runs_by_reservation
            or reservation.job_id in running_jobs
            or item.end_s - now_s <= policy.grace_s
        ):
            continue
        gpus_ready = all(
            gpu_id in gpu_by_id
            and gpu_by_id[gpu_id].state == GpuState.ACTIVE
            and gpu_id not in occupied
            for gpu_id in reservation.gpu_ids
        )
        if not gpus_ready:
            # slot_end is clearing them; the run that leaves produces the next event.
            continue
        for gpu_id in reservation.gpu_ids:
            occupied[gpu_id] = reservation.job_id
        running_jobs.add(reservation.job_id)
        starts.append(
            Start(
                job_id=reservation.job_id,
                gpu_ids=tuple(reservation.gpu_ids),
                must_end_by=to_instant(item.end_s),
                kind=RunKind.RESERVED,
                reservation_id=reservation.id,
            )
        )
    return starts
