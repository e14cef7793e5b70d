"""Policy: every run ends by its deadline, with a grace period to checkpoint first.

Rule: a run's deadline is the earliest of
* its `must_end_by` (a reserved run: its slot's end; a backfill run: the next reservation
  on its GPUs known at start, its time limit, its quota),
* the start of any other live reservation on its GPUs (reservations_first),
* `grace` after now when it must go for a reason with no fixed time: its reservation was
  cancelled or released, or one of its GPUs went into maintenance,
* `grace` after its stop was requested (a stop is never withdrawn).

At `deadline - grace` the run gets `Stop(grace = deadline - now)` (exactly `grace` when plan
runs on time, which `next_wakeup` arranges); once `stop_requested_at` is recorded the stop
is not sent again. At the deadline it gets `Kill`. The runner also knows `must_end_by` and
stops itself, so a slot ends on time even if the scheduler is down. Runs are visited by id.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scheduler.actions import Kill, Reason, Stop
from scheduler.index import ReservationIndex, Topology
from scheduler.instants import INFINITY, optional_seconds, to_seconds
from scheduler.policy import Policy
from scheduler.reservations_first import clearing_deadline_s
from scheduler.snapshot import Instant, Run, RunKind


@dataclass(frozen=True, slots=True)
class Deadline:
    at_s: float
    reason: Reason


def run_deadline(
    run: Run, index: ReservationIndex, topology: Topology, now_s: float, policy: Policy
) -> Deadline:
    must_end_by = run.must_end_by
    if must_end_by is None:
        must_end_by_s = INFINITY
    else:
        must_end_by_s = must_end_by if must_end_by.__class__ is float else to_seconds(must_end_by)
    own_reservation = None
    is_reserved = run.kind == RunKind.RESERVED
    if is_reserved:
        own_reservation = index.by_id.get(run.reservation_id)
    # A reserved run's must_end_by is its slot's end (the reservation may already have left
    # the snapshot at that instant, having ended).
    at_s, reason = must_end_by_s, Reason.SLOT_ENDING if is_reserved else Reason.DEADLINE
    if own_reservation is not None and own_reservation.end_s < at_s:
        at_s, reason = own_reservation.end_s, Reason.SLOT_ENDING

    clearing_s = clearing_deadline_s(run, index)
    # At equal times the reservation is the better explanation (a backfill run's
    # must_end_by is usually that very reservation's start).
    if clearing_s <= at_s and clearing_s != INFINITY:
        at_s, reason = clearing_s, Reason.RESERVATION_STARTING

    # Reasons without a fixed time: give a full grace from now (or from the stop request).
    stop_requested_s = optional_seconds(run.stop_requested_at)
    soft_reason = None
    if is_reserved and own_reservation is None:
        soft_reason = Reason.RESERVATION_GONE
    elif topology.maintenance_gpu_ids and not topology.maintenance_gpu_ids.isdisjoint(
        run.gpu_ids
    ):
        soft_reason = Reason.GPU_MAINTENANCE
    if soft_reason is not None:
        notice_from_s = stop_requested_s if stop_requested_s != INFINITY else now_s
        if notice_from_s + policy.grace_s < at_s:
            at_s, reason = notice_from_s + policy.grace_s, soft_reason
    if stop_requested_s + policy.grace_s < at_s:
        at_s, reason = stop_requested_s + policy.grace_s, Reason.STOP_GRACE_OVER
    return Deadline(at_s, reason)


def plan_stops(
    *,
    runs: list[Run],
    index: ReservationIndex,
    topology: Topology,
    now_s: float,
    policy: Policy,
    to_instant: Callable[[float], Instant],
    wakeups: list[float],
    deadlines: dict,
) -> tuple[list[Kill], list[Stop]]:
    kills: list[Kill] = []
    stops: list[Stop] = []
    grace_s = policy.grace_s
    earliest_wakeup = INFINITY
    # Fast path for the common run (backfill or reserved, no stop yet, no maintenance, slot
    # still booked): the same rule as run_deadline, inlined because a plan visits every run.
    simple_possible = not topology.maintenance_gpu_ids
    in_progress_on_gpu = index.in_progress_on_gpu
    next_start = index.next_start_on_gpu
    by_id = index.by_id
    backfill_kind = RunKind.BACKFILL
    for run in runs:
        if simple_possible and run.stop_requested_at is None:
            must_end_by = run.must_end_by
            if must_end_by is None:
                at_s = INFINITY
            elif must_end_by.__class__ is float:
                at_s = must_end_by
            else:
                at_s = to_seconds(must_end_by)
            if run.kind == backfill_kind:
                reason = Reason.DEADLINE
                own = None
            else:
                own = run.reservation_id
                own_item = by_id.get(own)
                if own_item is None:
                    deadline = run_deadline(run, index, topology, now_s, policy)
                    at_s, reason = deadline.at_s, deadline.reason
                    own = _SLOW
                else:
                    reason = Reason.SLOT_ENDING
                    if own_item.end_s < at_s:
                        at_s = own_item.end_s
            if own is not _SLOW:
                for gpu_id in run.gpu_ids:
                    item = in_progress_on_gpu.get(gpu_id)
                    if item is not None and item.reservation.id != own and item.start_s <= at_s:
                        at_s, reason = item.start_s, Reason.RESERVATION_STARTING
                    start_s = next_start.get(gpu_id, INFINITY)
                    if start_s <= at_s and start_s != INFINITY:
                        at_s, reason = start_s, Reason.RESERVATION_STARTING
        else:
            deadline = run_deadline(run, index, topology, now_s, policy)
            at_s, reason = deadline.at_s, deadline.reason
        deadlines[run.id] = at_s
        if at_s == INFINITY:
            continue
        if now_s >= at_s:
            kills.append(Kill(run.id, reason))
            continue
        if run.stop_requested_at is not None:
            earliest_wakeup = min(earliest_wakeup, at_s)
            continue
        stop_at_s = at_s - grace_s
        if now_s >= stop_at_s:
            earliest_wakeup = min(earliest_wakeup, at_s)
            stops.append(
                Stop(run_id=run.id, reason=reason, grace_s=at_s - now_s, kill_at=to_instant(at_s))
            )
        else:
            earliest_wakeup = min(earliest_wakeup, stop_at_s)
    wakeups.append(earliest_wakeup)
    return kills, stops


# Marks a run that took the general path inside the fast loop.
_SLOW = object()
