"""Slot end and deadlines: Stop at deadline - grace (once), Kill at the deadline."""

from __future__ import annotations

import pytest

from scheduler import GpuState, Kill, Policy, Reason, RunKind, Stop, plan, plan_detailed
from tests.scheduler.builders import GRACE_S, gpus, reservation, run, snapshot

POLICY = Policy(grace_s=GRACE_S)
END = 3600.0


def _reserved(stop_requested_at: float | None = None, booking_present: bool = True):
    booking = reservation(1, (0, 1), 0.0, END, job_id=77)
    reserved_run = run(
        5, (0, 1), job_id=77, kind=RunKind.RESERVED, reservation_id=1, must_end_by=END,
        stop_requested_at=stop_requested_at,
    )
    return snapshot(reservations=(booking,) if booking_present else (), runs=(reserved_run,))


@pytest.mark.parametrize(
    ("now", "stop_requested_at", "expected"),
    [
        (END - GRACE_S - 1.0, None, []),
        (END - GRACE_S, None, [Stop(5, Reason.SLOT_ENDING, GRACE_S, END)]),
        # Plan ran late: the stop carries the time that is left (the runner knew END anyway).
        (END - 30.0, None, [Stop(5, Reason.SLOT_ENDING, 30.0, END)]),
        (END - 30.0, END - GRACE_S, []),
        (END, END - GRACE_S, [Kill(5, Reason.SLOT_ENDING)]),
    ],
)
def test_reserved_run_is_stopped_grace_before_slot_end_and_killed_at_end(
    now, stop_requested_at, expected
):
    assert plan(_reserved(stop_requested_at), now, POLICY) == expected


def test_reserved_run_whose_booking_is_gone_gets_a_full_grace():
    state = _reserved(booking_present=False)
    assert plan(state, 100.0, POLICY) == [Stop(5, Reason.RESERVATION_GONE, GRACE_S, 160.0)]
    stopped = _reserved(stop_requested_at=100.0, booking_present=False)
    assert plan(stopped, 159.0, POLICY) == []
    assert plan(stopped, 160.0, POLICY) == [Kill(5, Reason.RESERVATION_GONE)]


def test_gpu_in_maintenance_stops_its_run_with_grace():
    state = snapshot(gpus=gpus(states={1: GpuState.MAINTENANCE}), runs=(run(5, (0, 1)),))
    assert plan(state, 10.0, POLICY) == [Stop(5, Reason.GPU_MAINTENANCE, GRACE_S, 70.0)]


def test_drained_gpu_keeps_its_run():
    state = snapshot(gpus=gpus(states={1: GpuState.DRAINED}), runs=(run(5, (0, 1)),))
    assert plan(state, 10.0, POLICY) == []


def test_backfill_time_limit_is_a_deadline():
    state = snapshot(runs=(run(5, (0,), must_end_by=1000.0),))
    assert plan(state, 940.0, POLICY) == [Stop(5, Reason.DEADLINE, GRACE_S, 1000.0)]
    assert plan_detailed(state, 0.0, POLICY).next_wakeup == 940.0


def test_a_stopped_run_that_ignores_its_stop_is_killed_after_the_grace():
    state = snapshot(runs=(run(5, (0,), stop_requested_at=100.0),))
    assert plan(state, 159.0, POLICY) == []
    assert plan(state, 160.0, POLICY) == [Kill(5, Reason.STOP_GRACE_OVER)]


def test_run_without_deadline_needs_no_wakeup():
    result = plan_detailed(snapshot(runs=(run(5, (0,)),)), 10.0, POLICY)
    assert result.actions == ()
    assert result.next_wakeup is None
