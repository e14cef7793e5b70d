"""Policy: release reservations that will not be used.

Rule:
* **no-show**: a live reservation with no job attached and nothing running on it
  `Policy.no_show_after_s` after its start is released (the booking service refunds the
  unused GPU-hours);
* **early finish**: a live reservation whose slot has begun, whose attached job has ended
  for good and that has nothing running is released for the rest of its slot.
Both can be switched off (`release_no_show`, `release_early_finish`). A reservation whose
job is attached but cannot start yet (its GPUs are still being cleared) is never a no-show:
that delay is the scheduler's, not the user's. Reservations are visited in (start, id) order.
"""

from __future__ import annotations

from scheduler.actions import Reason, Release
from scheduler.index import ReservationIndex
from scheduler.policy import Policy
from scheduler.snapshot import Id, Run


def plan_releases(
    index: ReservationIndex,
    runs_by_reservation: dict[Id, Run],
    now_s: float,
    policy: Policy,
    wakeups: list[float],
) -> list[Release]:
    releases = []
    if policy.release_no_show:
        # A future reservation without a job becomes a no-show candidate at start + N.
        wakeups.append(index.earliest_jobless_future_start_s + policy.no_show_after_s)
    for item in index.in_progress:
        reservation = item.reservation
        if reservation.id in runs_by_reservation:
            continue
        if reservation.job_id is None:
            if not policy.release_no_show:
                continue
            no_show_at = item.start_s + policy.no_show_after_s
            if now_s >= no_show_at:
                releases.append(Release(reservation.id, Reason.NO_SHOW))
            else:
                wakeups.append(no_show_at)
        elif reservation.job_finished and policy.release_early_finish:
            releases.append(Release(reservation.id, Reason.JOB_FINISHED_EARLY))
    return releases
