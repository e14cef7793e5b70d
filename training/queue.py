"""The queue as people read it: each queued job's position, estimated start and why it waits.

The figures come from the scheduler's own `plan()` rolled forward over the known bookings and
the running jobs' estimates (`scheduler.estimate_starts`, like Slurm's `squeue --start`). The
scheduler stores them on the job rows, so pages, the API and the CLI read a row instead of
re-planning per request. The submit form's preview (`queue_estimate_preview`) runs the same
rule once for a spec not yet submitted.
"""

import dataclasses
import datetime as dt
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import connection, transaction
from django.db.models import Q

import scheduler
from training import services
from training.models import TrainingJob
from training.snapshot import build_snapshot

FIELDS = ["queue_position", "estimated_start", "estimate_not_before", "wait_reason", "estimated_at"]


def queue_estimates_due(*, now: dt.datetime) -> bool:
    """Whether some queued job has no estimate yet or one older than the refresh interval."""
    stale_before = now - dt.timedelta(seconds=settings.GPUBOOK_QUEUE_ESTIMATE_SECONDS)
    return TrainingJob.objects.filter(state=TrainingJob.State.QUEUED).filter(
        Q(estimated_at__isnull=True) | Q(estimated_at__lte=stale_before)
    ).exists()


def queue_estimates_refresh(*, now: dt.datetime, policy: scheduler.Policy) -> int:
    """Store every queued job's estimate as of `now`, after this tick's starts and stops (so a
    fresh snapshot); returns how many rows were written. Jobs that wait for a booking of their
    own get no queue position: their slot is their start."""
    if not queue_estimates_due(now=now):
        return 0
    estimates = scheduler.estimate_starts(
        build_snapshot(now=now, policy=policy), now, policy, budget=settings.GPUBOOK_QUEUE_ESTIMATE_BUDGET
    )
    jobs = list(TrainingJob.objects.filter(state=TrainingJob.State.QUEUED).only("pk", *FIELDS))
    for job in jobs:
        estimate = estimates.get(job.pk)
        job.queue_position = estimate.position if estimate else None
        job.estimated_start = estimate.estimated_start if estimate else None
        job.estimate_not_before = estimate.not_before if estimate else None
        job.wait_reason = estimate.wait_reason.sentence if estimate else ""
        job.estimated_at = now
    if connection.vendor == "postgresql":
        _store_in_one_statement(jobs, now=now)
    else:
        TrainingJob.objects.bulk_update(jobs, FIELDS, batch_size=500)
    return len(jobs)


@dataclasses.dataclass(frozen=True)
class StartPreview:
    job: TrainingJob  # the row job_submit would make (rolled back: no pk to link to)
    position: int | None  # None for a job that runs in a booking
    estimated_start: dt.datetime | None
    wait_reason: str
    # No start found within the estimate's budget: it starts no earlier than this.
    not_before: dt.datetime | None = None


def queue_estimate_preview(
    *, user: AbstractBaseUser, document: Any, reservation_id: int | None, now: dt.datetime, policy: scheduler.Policy
) -> StartPreview:
    """What the queue would say about this spec if it were submitted now (the submit form shows
    it before submitting). The job is submitted for real inside a transaction that is rolled
    back, so the figures are the very rule the scheduler stores each tick (build_snapshot →
    scheduler.estimate_starts) applied to the very row job_submit would make, with its
    validation and its runtime prediction. Raises what job_submit raises."""
    with transaction.atomic():
        job = services.job_submit(user=user, document=document, reservation_id=reservation_id, now=now)
        estimate = None
        if job.reservation_id is None:
            snapshot = build_snapshot(now=now, policy=policy)
            estimate = scheduler.estimate_starts(
                snapshot, now, policy, budget=settings.GPUBOOK_QUEUE_ESTIMATE_BUDGET, until_started=job.pk
            ).get(job.pk)
        booking = job.reservation
        transaction.set_rollback(True)
    if booking is not None:
        return StartPreview(job=job, position=None, estimated_start=max(booking.start, now), wait_reason="")
    return StartPreview(
        job=job, position=estimate.position if estimate else None,
        estimated_start=estimate.estimated_start if estimate else None,
        wait_reason=estimate.wait_reason.sentence if estimate else "",
        not_before=estimate.not_before if estimate else None,
    )


def _store_in_one_statement(jobs: list[TrainingJob], *, now: dt.datetime) -> None:
    """PostgreSQL: every row in one UPDATE joined to arrays of the new values. `bulk_update`
    writes a CASE with one branch per row, which PostgreSQL evaluates row by row: 2,000 queued
    jobs took seconds of the scheduler's tick (issue #19)."""
    columns = {name: TrainingJob._meta.get_field(name).column for name in FIELDS}
    quote = connection.ops.quote_name
    assignments = ", ".join(f"{quote(columns[name])} = new.{name}" for name in FIELDS if name != "estimated_at")
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {quote(TrainingJob._meta.db_table)} AS job SET {assignments},"  # noqa: S608 (names from the model)
            f" {quote(columns['estimated_at'])} = %s"
            " FROM unnest(%s::bigint[], %s::integer[], %s::timestamptz[], %s::timestamptz[], %s::text[])"
            "  AS new(id, queue_position, estimated_start, estimate_not_before, wait_reason)"
            " WHERE job.id = new.id",
            [
                now,
                [job.pk for job in jobs],
                [job.queue_position for job in jobs],
                [job.estimated_start for job in jobs],
                [job.estimate_not_before for job in jobs],
                [job.wait_reason for job in jobs],
            ],
        )
