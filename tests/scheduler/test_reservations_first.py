"""Reservations first: GPUs are cleared `grace` before a slot, the reserved job starts at
slot start on all its GPUs, and nothing else ever takes them."""

from __future__ import annotations

import pytest

from scheduler import (
    Kill,
    Policy,
    Reason,
    ReservationStatus,
    RunKind,
    Start,
    Stop,
    plan,
    plan_detailed,
)
from tests.scheduler.builders import GRACE_S, job, of_type, reservation, run, snapshot

POLICY = Policy(grace_s=GRACE_S)
SLOT_START = 1800.0
SLOT_END = 3600.0


def _backfill_in_the_way(**run_fields) -> tuple:
    booked = reservation(1, (0, 1), SLOT_START, SLOT_END, job_id=77)
    squatter = run(5, (1, 2), **run_fields)
    return snapshot(reservations=(booked,), runs=(squatter,))


@pytest.mark.parametrize(
    ("now", "stop_requested_at", "expected"),
    [
        # Before start - grace: nothing yet, but plan asks to be woken at start - grace.
        (1000.0, None, []),
        # At start - grace: a stop with exactly the grace period.
        (
            SLOT_START - GRACE_S,
            None,
            [Stop(5, Reason.RESERVATION_STARTING, GRACE_S, SLOT_START)],
        ),
        # Stop already delivered: not sent again.
        (SLOT_START - 30.0, SLOT_START - GRACE_S, []),
        # Still there at the start: killed so the slot starts on time.
        (SLOT_START, SLOT_START - GRACE_S, [Kill(5, Reason.RESERVATION_STARTING)]),
    ],
)
def test_backfill_on_reserved_gpus_is_cleared_by_slot_start(now, stop_requested_at, expected):
    state = _backfill_in_the_way(stop_requested_at=stop_requested_at)
    actions = plan(state, now, POLICY)
    assert [a for a in actions if not isinstance(a, Start)] == expected


def test_next_wakeup_is_start_minus_grace_for_a_run_in_the_way():
    state = _backfill_in_the_way()
    assert plan_detailed(state, 1000.0, POLICY).next_wakeup == SLOT_START - GRACE_S


def test_reservation_booked_after_the_run_started_still_clears_it():
    # The run had no deadline when it started; the booking arrives later.
    state = _backfill_in_the_way(must_end_by=None, started_at=0.0)
    actions = plan(state, SLOT_START - GRACE_S, POLICY)
    assert of_type(actions, Stop) == [Stop(5, Reason.RESERVATION_STARTING, GRACE_S, SLOT_START)]


def test_reserved_job_starts_at_slot_start_on_all_its_gpus():
    state = snapshot(reservations=(reservation(1, (0, 1), SLOT_START, SLOT_END, job_id=77),))
    assert plan(state, SLOT_START, POLICY) == [
        Start(
            job_id=77,
            gpu_ids=(0, 1),
            must_end_by=SLOT_END,
            kind=RunKind.RESERVED,
            reservation_id=1,
        )
    ]
    assert plan(state, SLOT_START - 1.0, POLICY) == []


@pytest.mark.parametrize(
    ("case", "extra"),
    [
        ("a GPU is still held", {"runs": (run(5, (1,), stop_requested_at=SLOT_START - 60),)}),
        ("the job runs elsewhere", {"runs": (run(5, (9,), job_id=77),)}),
    ],
)
def test_reserved_job_waits_when(case, extra):
    state = snapshot(
        reservations=(reservation(1, (0, 1), SLOT_START, SLOT_END, job_id=77),), **extra
    )
    assert of_type(plan(state, SLOT_START + 1.0, POLICY), Start) == [], case


@pytest.mark.parametrize(
    "booking",
    [
        reservation(1, (0, 1), SLOT_START, SLOT_END, job_id=77, job_finished=True),
        reservation(1, (0, 1), SLOT_START, SLOT_END, job_id=77,
                    status=ReservationStatus.PENDING),
        reservation(1, (0, 1), SLOT_START, SLOT_END, job_id=77,
                    status=ReservationStatus.CANCELLED),
        # Less than a grace period left: starting would only be stopped at once.
        reservation(1, (0, 1), SLOT_START - 3600.0 + 30.0, SLOT_START + 30.0, job_id=77),
    ],
)
def test_reserved_job_not_started(booking):
    starts = of_type(plan(snapshot(reservations=(booking,)), SLOT_START, POLICY), Start)
    assert [start for start in starts if start.kind == RunKind.RESERVED] == []


def test_queued_jobs_never_take_gpus_of_a_slot_in_progress():
    # Nothing runs on the reservation yet (its job has not been attached): still its GPUs.
    booked = reservation(1, tuple(range(8)), 0.0, SLOT_END, job_id=None)
    state = snapshot(reservations=(booked,), queued_jobs=(job(1, 1, estimate_s=60.0),))
    starts = of_type(plan(state, 60.0, Policy(release_no_show=False)), Start)
    assert len(starts) == 1
    assert set(starts[0].gpu_ids).isdisjoint(range(8))


def test_late_booking_over_a_running_job_kills_it_at_once():
    # Booked after its own start (the booking service should refuse this): the slot wins.
    booked = reservation(1, (0,), 0.0, SLOT_END, job_id=77)
    state = snapshot(reservations=(booked,), runs=(run(5, (0,)),))
    assert of_type(plan(state, 100.0, POLICY), Kill) == [Kill(5, Reason.RESERVATION_STARTING)]
