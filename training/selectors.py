import datetime as dt

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import F, QuerySet

from reservations.models import Team
from training.models import Run, TrainingJob


def jobs_visible_to(*, user: AbstractBaseUser) -> QuerySet[TrainingJob]:
    jobs = TrainingJob.objects.select_related("team", "user", "image")
    if user.is_superuser:
        return jobs
    return jobs.filter(team__in=Team.objects.filter(memberships__user=user))



def _booking_jobs() -> QuerySet[TrainingJob]:
    """The rule for the job a booking will run (or runs): its first unfinished attached job by
    submit time, the one training.snapshot hands plan() for that booking."""
    return TrainingJob.objects.exclude(state__in=TrainingJob.FINISHED).order_by("reservation_id", "submitted_at", "pk")


def booking_job(*, reservation_id: int) -> TrainingJob | None:
    return _booking_jobs().filter(reservation_id=reservation_id).select_related("user").first()


def booking_job_details(*, start: dt.datetime, end: dt.datetime) -> dict[int, dict]:
    """For the calendar feed (reservations.calendar_feed.booking_details): the job of each
    booking overlapping [start, end), named in its title. One query over the unfinished jobs
    attached to those bookings; the feed shows them only on bookings the viewer sees in full."""
    details: dict[int, dict] = {}
    rows = _booking_jobs().filter(reservation__start__lt=end, reservation__end__gt=start)
    for reservation_id, job_id, name in rows.values_list("reservation_id", "pk", "name"):
        details.setdefault(reservation_id, {"label": f"job {name}", "job": {"id": job_id, "name": name}})
    return details


def runs_visible_to(*, user: AbstractBaseUser) -> QuerySet[Run]:
    runs = Run.objects.select_related("job")
    if user.is_superuser:
        return runs
    return runs.filter(job__team__in=Team.objects.filter(memberships__user=user))


def queue_for(*, user: AbstractBaseUser) -> list[dict]:
    """The whole cluster's queue in the order backfill tries it (training/queue.py keeps the
    figures). Other teams' jobs are shown as the calendar shows their bookings: anonymised."""
    own_teams = set() if user.is_superuser else set(
        Team.objects.filter(memberships__user=user).values_list("pk", flat=True)
    )
    rows = []
    queued = TrainingJob.objects.filter(state=TrainingJob.State.QUEUED, reservation__isnull=True)
    ordered = queued.select_related("team", "user").order_by(
        F("queue_position").asc(nulls_last=True), "submitted_at", "pk"
    )
    for job in ordered:
        visible = user.is_superuser or job.team_id in own_teams
        rows.append({
            "job": job if visible else None, "position": job.queue_position, "gpus": job.gpus_needed,
            "priority": job.get_priority_display(), "estimated_start": job.estimated_start,
            "not_before": job.estimate_not_before,
            "wait_reason": job.wait_reason, "submitted_at": job.submitted_at,
        })
    return rows
