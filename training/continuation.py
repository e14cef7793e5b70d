"""Jobs that live across slots: what a job does when its booking ends before it does.

A job is never left attached to a booking that is over (ended, released, cancelled). At every
tick, for each waiting (queued, not running) job attached to such a booking, its `then` says:
- `next_booking`: it moves to its owner's next confirmed booking on a node with enough GPUs
  (a teammate's too when `then_team`), and resumes there from its checkpoint; with none
  booked yet it waits for one (`waiting_for=booking`) — it does not join the backfill queue;
- `backfill`: it joins the backfill queue with its checkpoint;
- `hold`: it waits for its owner (`waiting_for=user`), who attaches it to a booking or
  queues it from the job page or the API.
And a booking with no job of its own picks up a job of its owner (or a team job allowed to
move) that waits for a booking, the one submitted first.

Level-triggered and idempotent like the rest of reconcile: each move is a compare-and-set on
the job's row, so a crash between two moves leaves nothing half done.
"""

import dataclasses
import datetime as dt

from django.db.models import Q

from reservations.models import Reservation
from training.models import Then, TrainingJob, WaitingFor

LIVE_BOOKING = (Reservation.Status.CONFIRMED, Reservation.Status.ACTIVE)


@dataclasses.dataclass
class Continued:
    moved: dict[int, int] = dataclasses.field(default_factory=dict)  # job id → the booking it moved to
    queued: list[int] = dataclasses.field(default_factory=list)  # joined the backfill queue
    waiting: list[int] = dataclasses.field(default_factory=list)  # wait for a booking
    held: list[int] = dataclasses.field(default_factory=list)  # wait for their owner


def jobs_continue(*, now: dt.datetime) -> Continued:
    done = Continued()
    _leave_ended_bookings(now=now, done=done)
    _fill_bookings(now=now, done=done)
    return done


def _leave_ended_bookings(*, now: dt.datetime, done: Continued) -> None:
    over = Q(reservation__end__lte=now) | ~Q(reservation__status__in=LIVE_BOOKING)
    stranded = TrainingJob.objects.filter(state=TrainingJob.State.QUEUED, reservation__isnull=False).filter(over)
    for job in stranded.order_by("submitted_at", "pk"):
        if job.then == Then.NEXT_BOOKING:
            waiting_for, into = WaitingFor.BOOKING, done.waiting
        elif job.then == Then.HOLD:
            waiting_for, into = WaitingFor.USER, done.held
        else:
            waiting_for, into = WaitingFor.SLOT, done.queued
        claimed = TrainingJob.objects.filter(
            pk=job.pk, state=TrainingJob.State.QUEUED, reservation_id=job.reservation_id
        ).update(reservation=None, waiting_for=waiting_for)
        if claimed:
            into.append(job.pk)


def _fill_bookings(*, now: dt.datetime, done: Continued) -> None:
    """Give each waiting job the earliest live booking it may take that has no job of its own."""
    waiting = list(
        TrainingJob.objects.filter(
            state=TrainingJob.State.QUEUED, reservation__isnull=True, waiting_for=WaitingFor.BOOKING
        ).order_by("submitted_at", "pk")
    )
    if not waiting:
        return
    teams = {job.team_id for job in waiting}
    busy = set(
        TrainingJob.objects.filter(reservation__isnull=False, reservation__end__gt=now)
        .exclude(state__in=TrainingJob.FINISHED)
        .values_list("reservation_id", flat=True)
    )
    bookings = [
        booking for booking in Reservation.objects.filter(team_id__in=teams, status__in=LIVE_BOOKING, end__gt=now)
        .order_by("start", "pk")
        if booking.pk not in busy
    ]
    for job in waiting:
        booking = next(
            (
                booking for booking in bookings
                if booking.team_id == job.team_id and (booking.user_id == job.user_id or job.then_team)
                and booking.gpu_count >= job.gpus_needed and booking.pk not in busy
            ),
            None,
        )
        if booking is None:
            continue
        if TrainingJob.objects.filter(
            pk=job.pk, state=TrainingJob.State.QUEUED, reservation__isnull=True, waiting_for=WaitingFor.BOOKING
        ).update(reservation=booking, waiting_for=WaitingFor.SLOT):
            busy.add(booking.pk)
            done.moved[job.pk] = booking.pk
