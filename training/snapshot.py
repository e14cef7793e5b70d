"""The database as the scheduler sees it: one frozen `scheduler.Snapshot` per tick.

The adapter between the ORM and the pure core: GPUs, the live reservations with the job each
will run, the queue, the live runs, recent usage (fair share) and each team's quota position.
Nothing here decides anything; `scheduler.plan()` does.
"""

import datetime as dt

import scheduler
from gpus.models import Gpu
from reservations import selectors as reservation_selectors
from reservations.models import Reservation, Team
from training.models import Run, TrainingJob

USAGE_WINDOW = dt.timedelta(days=28)  # four half-lives: older usage weighs < 7 %


def build_snapshot(*, now: dt.datetime, policy: scheduler.Policy) -> scheduler.Snapshot:
    gpus = tuple(
        scheduler.Gpu(id=gpu_id, node=node_id, index=index, state=scheduler.GpuState(state))
        for gpu_id, node_id, index, state in Gpu.objects.values_list("pk", "node_id", "index", "state")
    )
    live = Reservation.objects.filter(
        status__in=(Reservation.Status.CONFIRMED, Reservation.Status.ACTIVE), end__gt=now
    ).prefetch_related("booked", "jobs")
    reservations = []
    for reservation in live:
        attached = sorted(reservation.jobs.all(), key=lambda job: (job.submitted_at, job.pk))
        waiting = [job for job in attached if job.state not in TrainingJob.FINISHED]
        job = waiting[0] if waiting else (attached[-1] if attached else None)
        reservations.append(
            scheduler.Reservation(
                id=reservation.pk, gpu_ids=tuple(sorted(row.gpu_id for row in reservation.booked.all())),
                start=reservation.start, end=reservation.end, team=reservation.team_id, user=reservation.user_id,
                status=scheduler.ReservationStatus(reservation.status), job_id=job.pk if job else None,
                job_finished=bool(attached) and not waiting,
            )
        )
    queued = tuple(
        scheduler.QueuedJob(
            id=job.pk, team=job.team_id, user=job.user_id, gpus_needed=job.gpus_needed, submitted_at=job.submitted_at,
            priority=scheduler.Priority(job.priority), estimated_duration_s=job.estimated_duration_s,
            checkpointable=job.checkpointable, times_preempted=job.times_preempted, timeout_s=job.timeout_s,
        )
        for job in TrainingJob.objects.filter(state=TrainingJob.State.QUEUED, reservation__isnull=True)
    )
    runs = tuple(
        scheduler.Run(
            id=run.pk, job_id=run.job_id, gpu_ids=tuple(run.gpu_ids), kind=scheduler.RunKind(run.kind),
            started_at=run.started_at or run.created_at, team=run.job.team_id, user=run.job.user_id,
            reservation_id=run.reservation_id, must_end_by=run.must_end_by, stop_requested_at=run.stop_requested_at,
            estimated_end=run.estimated_end, priority=scheduler.Priority(run.job.priority),
        )
        for run in Run.objects.filter(state__in=Run.LIVE).select_related("job")
    )
    return scheduler.Snapshot(
        gpus=gpus, reservations=tuple(reservations), queued_jobs=queued, runs=runs,
        usage=_usage(now=now, policy=policy), teams=_team_accounts(now=now, policy=policy),
    )


def _usage(*, now: dt.datetime, policy: scheduler.Policy) -> tuple[scheduler.Usage, ...]:
    """Each finished run's GPU-seconds (backfill at the usage factor), as of its end."""
    records = []
    for kind, started, ended, gpu_ids, team, user in Run.objects.filter(
        ended_at__gte=now - USAGE_WINDOW, started_at__isnull=False
    ).values_list("kind", "started_at", "ended_at", "gpu_ids", "job__team_id", "job__user_id"):
        factor = policy.usage_factor if kind == Run.Kind.BACKFILL else 1.0
        seconds = max(0.0, (ended - started).total_seconds()) * len(gpu_ids) * factor
        records.append(scheduler.Usage(team=team, user=user, gpu_seconds=seconds, as_of=ended))
    return tuple(records)


def _team_accounts(*, now: dt.datetime, policy: scheduler.Policy) -> tuple[scheduler.TeamAccount, ...]:
    teams = list(Team.objects.all())
    # The one quota rule (bookings + backfill charged), the same figure the booking check reads.
    positions = reservation_selectors.quota_positions(teams=teams, now=now)
    return tuple(
        scheduler.TeamAccount(
            team=team.pk, share=team.fair_share or float(team.monthly_gpu_hours or 1),
            quota_remaining_gpu_s=positions[team.pk].remaining_gpu_s,
        )
        for team in teams
    )
