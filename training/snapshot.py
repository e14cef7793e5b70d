"""The database as the scheduler sees it: one frozen `scheduler.Snapshot` per tick.

The adapter between the ORM and the pure core: GPUs, the live reservations with the job each
will run, the queue, the live runs, recent usage (fair share) and each team's quota position.
Nothing here decides anything; `scheduler.plan()` does.
"""

import datetime as dt
from collections import defaultdict

from django.db.models import F
from django.db.models.functions import Coalesce

import scheduler
from gpus.models import Gpu
from reservations import selectors as reservation_selectors
from reservations.models import Reservation, ReservationGpu, Team
from training.models import Run, TrainingJob, WaitingFor

USAGE_WINDOW = dt.timedelta(days=28)  # four half-lives: older usage weighs < 7 %
LIVE_BOOKING = (Reservation.Status.CONFIRMED, Reservation.Status.ACTIVE)


def build_snapshot(*, now: dt.datetime, policy: scheduler.Policy) -> scheduler.Snapshot:
    gpus = tuple(
        scheduler.Gpu(id=gpu_id, node=node_id, index=index, state=scheduler.GpuState(state))
        for gpu_id, node_id, index, state in Gpu.objects.values_list("pk", "node_id", "index", "state")
    )
    # Plain rows, one query per kind (no per-row related querysets: a tick at cluster scale
    # reads thousands of bookings and queued jobs, issue #19).
    live = {"reservation__status__in": LIVE_BOOKING, "reservation__end__gt": now}
    booked: dict[int, list[int]] = defaultdict(list)
    for reservation_id, gpu_id in ReservationGpu.objects.filter(**live).values_list("reservation_id", "gpu_id"):
        booked[reservation_id].append(gpu_id)
    attached: dict[int, list[tuple]] = defaultdict(list)
    for reservation_id, job_id, state, submitted_at in TrainingJob.objects.filter(**live).values_list(
        "reservation_id", "pk", "state", "submitted_at"
    ):
        attached[reservation_id].append((submitted_at, job_id, state))
    reservations = []
    for pk, start, end, team, user, status in Reservation.objects.filter(
        status__in=LIVE_BOOKING, end__gt=now
    ).values_list("pk", "start", "end", "team_id", "user_id", "status"):
        jobs = sorted(attached.get(pk, ()))
        waiting = [job_id for _, job_id, state in jobs if state not in TrainingJob.FINISHED]
        job_id = waiting[0] if waiting else (jobs[-1][1] if jobs else None)
        reservations.append(
            scheduler.Reservation(
                id=pk, gpu_ids=tuple(sorted(booked.get(pk, ()))), start=start, end=end, team=team, user=user,
                status=scheduler.ReservationStatus(status), job_id=job_id, job_finished=bool(jobs) and not waiting,
            )
        )
    queued = tuple(
        scheduler.QueuedJob(
            id=pk, team=team, user=user, gpus_needed=gpus_needed, submitted_at=submitted_at,
            priority=scheduler.Priority(priority), estimated_duration_s=estimate, checkpointable=checkpointable,
            times_preempted=times_preempted, timeout_s=timeout_s,
        )
        for pk, team, user, gpus_needed, submitted_at, priority, estimate, checkpointable, times_preempted, timeout_s
        in TrainingJob.objects.filter(
            state=TrainingJob.State.QUEUED, reservation__isnull=True, waiting_for=WaitingFor.SLOT
        ).values_list(
            # The prediction from the owner's history (training/runtime.py) before the user's own estimate.
            "pk", "team_id", "user_id", "gpus_needed", "submitted_at", "priority",
            Coalesce("predicted_duration_s", "estimated_duration_s"), "checkpointable", "times_preempted", "timeout_s",
        )
    )
    runs = tuple(
        scheduler.Run(
            id=pk, job_id=job_id, gpu_ids=tuple(gpu_ids), kind=scheduler.RunKind(kind),
            started_at=started_at or created_at, team=team, user=user, reservation_id=reservation_id,
            must_end_by=must_end_by, stop_requested_at=stop_requested_at, estimated_end=estimated_end,
            priority=scheduler.Priority(priority), checkpointable=checkpointable,
            times_preempted=times_preempted,
        )
        for (pk, job_id, gpu_ids, kind, started_at, created_at, team, user, reservation_id, must_end_by,
             stop_requested_at, estimated_end, priority, checkpointable, times_preempted)
        in Run.objects.filter(state__in=Run.LIVE).values_list(
            "pk", "job_id", "gpu_ids", "kind", "started_at", "created_at", "job__team_id", "job__user_id",
            "reservation_id", "must_end_by", "stop_requested_at", "estimated_end", "job__priority",
            "job__checkpointable",  # priority preemption stops checkpointable runs first
            "job__times_preempted",  # queue relief stops a job at most once
        )
    )
    return scheduler.Snapshot(
        gpus=gpus, reservations=tuple(reservations), queued_jobs=queued, runs=runs,
        usage=_usage(now=now, policy=policy), teams=_team_accounts(now=now, policy=policy),
        relief_history=_relief_history(now=now, policy=policy), drains=_drains(now=now, policy=policy),
    )


# Relief's budget counts its own stops and the drain's: each keeps its sentence as its reason.
BUDGETED_STOPS = sorted(reason.sentence for reason in scheduler.BUDGETED_REASONS)


def _relief_history(*, now: dt.datetime, policy: scheduler.Policy) -> scheduler.ReliefHistory:
    """Queue relief's budget window: its stops and the drain's (a stopped run keeps the
    sentence as its reason through its checkpoint) and the jobs submitted to the queue."""
    since = now - dt.timedelta(seconds=policy.relief_budget_window_s)
    stops = Run.objects.filter(reason__in=BUDGETED_STOPS, stop_requested_at__gt=since).values_list(
        "stop_requested_at", flat=True
    )
    submitted = TrainingJob.objects.filter(submitted_at__gt=since, reservation__isnull=True).count()
    return scheduler.ReliefHistory(stops=tuple(stops), jobs_submitted=submitted)


def _drains(*, now: dt.datetime, policy: scheduler.Policy) -> tuple[scheduler.Drain, ...]:
    """The queue drains in relief's window whose job is still queued and has not run since."""
    since = now - dt.timedelta(seconds=policy.relief_budget_window_s)
    rows = (
        Run.objects.filter(
            reason=scheduler.Reason.QUEUE_DRAIN.sentence, stop_requested_at__gt=since,
            stopped_for__state=TrainingJob.State.QUEUED,
        )
        .exclude(stopped_for__runs__created_at__gt=F("stop_requested_at"))
        .values_list("stop_requested_at", "stopped_for_id", "gpu_ids")
    )
    return tuple(scheduler.Drain(at=at, job_id=job_id, gpu_ids=tuple(gpu_ids)) for at, job_id, gpu_ids in rows)


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
