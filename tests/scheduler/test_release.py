"""No-show and early-finish release."""

from __future__ import annotations

from scheduler import Policy, Reason, Release, RunKind, Start, plan, plan_detailed
from tests.scheduler.builders import job, of_type, reservation, run, snapshot

POLICY = Policy(no_show_after_s=900.0)


def test_no_show_is_released_at_the_threshold_not_before():
    booked = reservation(1, (0, 1), 1000.0, 5000.0, job_id=None)
    state = snapshot(reservations=(booked,))
    before = plan_detailed(state, 1000.0 + 899.0, POLICY)
    assert before.actions == ()
    assert before.next_wakeup == 1900.0
    assert plan(state, 1900.0, POLICY) == [Release(1, Reason.NO_SHOW)]


def test_future_jobless_reservation_asks_for_a_wakeup_at_its_no_show_time():
    state = snapshot(reservations=(reservation(1, (0,), 1000.0, 5000.0, job_id=None),))
    # The start (1000) comes first; the no-show time is a later wake-up.
    assert plan_detailed(state, 0.0, POLICY).next_wakeup == 1000.0
    assert plan_detailed(state, 1000.0, POLICY).next_wakeup == 1900.0


def test_reservation_with_its_job_running_is_not_a_no_show():
    booked = reservation(1, (0, 1), 1000.0, 5000.0, job_id=None)
    reserved = run(5, (0, 1), kind=RunKind.RESERVED, reservation_id=1, must_end_by=5000.0)
    assert plan(snapshot(reservations=(booked,), runs=(reserved,)), 3000.0, POLICY) == []


def test_attached_job_waiting_for_its_gpus_is_not_a_no_show():
    booked = reservation(1, (0,), 1000.0, 5000.0, job_id=77)
    squatter = run(5, (0,), stop_requested_at=1000.0)  # still checkpointing
    actions = plan(snapshot(reservations=(booked,), runs=(squatter,)), 2000.0, POLICY)
    assert of_type(actions, Release) == []


def test_early_finish_releases_the_rest_and_backfill_uses_it_at_once():
    gpu_ids = tuple(range(8))
    booked = reservation(1, gpu_ids, 0.0, 7200.0, job_id=77, job_finished=True)
    # Node 1 is fully busy, so the only place for the queued job is the released node.
    busy = run(9, tuple(range(100, 108)))
    state = snapshot(reservations=(booked,), runs=(busy,), queued_jobs=(job(1, 8),))
    actions = plan(state, 600.0, POLICY)
    assert of_type(actions, Release) == [Release(1, Reason.JOB_FINISHED_EARLY)]
    (start,) = of_type(actions, Start)
    assert start.gpu_ids == gpu_ids


def test_releases_can_be_switched_off():
    policy = Policy(release_no_show=False, release_early_finish=False)
    state = snapshot(
        reservations=(
            reservation(1, (0,), 0.0, 7200.0, job_id=None),
            reservation(2, (1,), 0.0, 7200.0, job_id=77, job_finished=True),
        )
    )
    assert plan(state, 3600.0, policy) == []
