"""Choosing the GPUs of a booking around the runs of the moment (#15): the database side of
`scheduler.booking_placement`, for "book N GPUs, choose them for me" (the booking form, the
API's `booking-placement/`, `gpubook book --count`).

A user who books specific GPUs may stop whatever backfill runs there at the slot's start. A
user who only needs N GPUs of one node lets the same rule the simulator's booking service
follows pick them: the least work thrown away, then a node where no checkpointable run must
restart, then one where no run's work is at risk, then the first node in the calendar's order
(bookings pile up on the first nodes; the last stay free for wide and long jobs). The answer
is advice: booking it goes
through `reservations.services.reservation_create` like any other booking. Runs are
`training`'s table, read through the app registry: this room sits below training and imports
none of it.
"""

import datetime as dt

from django.apps import apps

import scheduler
from config.errors import Conflict, DomainError, ErrorCode
from reservations import selectors
from scheduler.booking_placement import Occupant, Placement, choose_gpus
from scheduler.instants import to_seconds


def _occupants() -> dict[int, Occupant]:
    """The live runs by GPU."""
    run_model = apps.get_model("training", "Run")
    occupants: dict[int, Occupant] = {}
    for pk, gpu_ids, kind, started_at, created_at, estimated_end, predicted_s, checkpointable in (
        run_model.objects.filter(state__in=run_model.LIVE).values_list(
            "pk", "gpu_ids", "kind", "started_at", "created_at", "estimated_end",
            "job__predicted_duration_s", "job__checkpointable",
        )
    ):
        occupant = Occupant(
            run_id=pk,
            gpus=len(gpu_ids),
            started_at_s=to_seconds(started_at or created_at),
            checkpointable=checkpointable,
            # Trusted only when it comes from the owner's history (training/runtime.py): a
            # user's guess or the default says nothing about when the run really ends.
            expected_end_s=(
                to_seconds(estimated_end)
                if estimated_end is not None and predicted_s is not None
                else None
            ),
            reserved=kind == run_model.Kind.RESERVED,
        )
        for gpu_id in gpu_ids:
            occupants[gpu_id] = occupant
    return occupants


def choose_booking_gpus(
    *, gpu_count: int, start: dt.datetime, end: dt.datetime, now: dt.datetime, policy: scheduler.Policy
) -> Placement:
    """The `gpu_count` GPUs of one node to book for [start, end), chosen around the live runs,
    with what their booking would cost other work (GPU-seconds lost for certain, spent on
    restarts of runs that can checkpoint, and at risk if an estimate errs). Conflict(NO_ROOM)
    when no node has that many GPUs free throughout."""
    if gpu_count < 1:
        raise DomainError(ErrorCode.NO_GPUS, "Ask for at least one GPU.")
    if end <= start:
        raise DomainError(ErrorCode.INVALID_RANGE, "The end must be after the start.")
    occupants = _occupants()
    placement = choose_gpus(
        free_by_node=selectors.calendar_free_gpus(start=start, end=end),
        occupant_of=occupants.get,
        needed=gpu_count,
        start_s=to_seconds(start),
        now_s=to_seconds(now),
        # A stopped run that can checkpoint saves within the grace period, then restarts.
        stop_cost_s=policy.grace_s,
        policy=policy,
    )
    if placement is None:
        raise Conflict(
            ErrorCode.NO_ROOM, f"No node has {gpu_count} GPU{'s' if gpu_count != 1 else ''} free for the whole slot."
        )
    return placement
