"""The queue as people read it: each queued job's position, estimated start and why it waits.

The figures come from the scheduler's own `plan()` rolled forward over the known bookings and
the running jobs' estimates (`scheduler.estimate_starts`, like Slurm's `squeue --start`). The
scheduler stores them on the job rows, so pages, the API and the CLI read a row instead of
re-planning per request.
"""

import datetime as dt

from django.conf import settings
from django.db import connection
from django.db.models import Q

import scheduler
from training.models import TrainingJob
from training.snapshot import build_snapshot

FIELDS = ["queue_position", "estimated_start", "wait_reason", "estimated_at"]


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
    estimates = scheduler.estimate_starts(build_snapshot(now=now, policy=policy), now, policy)
    jobs = list(TrainingJob.objects.filter(state=TrainingJob.State.QUEUED).only("pk", *FIELDS))
    for job in jobs:
        estimate = estimates.get(job.pk)
        job.queue_position = estimate.position if estimate else None
        job.estimated_start = estimate.estimated_start if estimate else None
        job.wait_reason = estimate.wait_reason.sentence if estimate else ""
        job.estimated_at = now
    if connection.vendor == "postgresql":
        _store_in_one_statement(jobs, now=now)
    else:
        TrainingJob.objects.bulk_update(jobs, FIELDS, batch_size=500)
    return len(jobs)


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
            " FROM unnest(%s::bigint[], %s::integer[], %s::timestamptz[], %s::text[])"
            "  AS new(id, queue_position, estimated_start, wait_reason)"
            " WHERE job.id = new.id",
            [
                now,
                [job.pk for job in jobs],
                [job.queue_position for job in jobs],
                [job.estimated_start for job in jobs],
                [job.wait_reason for job in jobs],
            ],
        )
