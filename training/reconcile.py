"""reconcile(now): make the world match the plan, one level-triggered, idempotent tick.

Steps (STYLE.md habit 5; each can crash and the next tick repairs it):
1. advance reservation statuses along the clock;
2. observe the executor and record what ended (runs, then their jobs);
3. repair: start claimed runs the executor does not know (crash between claim and start),
   deliver stops that were asked for but not sent (crash between claim and stop, or a stop
   asked by a page or the watchdog) — a stop is sent once, and again only when the first
   provably did not arrive (the local supervisor that was to forward it is gone);
4. continue: jobs whose booking is over move on as their `then` says (the owner's next
   booking, the queue, or held), and bookings without a job pick up a waiting one;
5. plan: snapshot the database → `scheduler.plan_detailed(snapshot, now, policy)`;
6. apply each action: claim it in the database with compare-and-set and commit, then call
   the executor — never inside a transaction;
7. notices that depend only on the clock (slot ending soon, waiting too long).

The queue as people read it (every queued job's position, estimated start and why it waits,
`training.queue`) is refreshed by the loop's tick (`training.loop.scheduler_tick`) after this
one returns, outside its lock: it can take seconds on a large cluster.

The rooms around it: `training.snapshot` (database → snapshot), `training.launch` (claimed
run → RunSpec → executor), `training.run_state` (every change of a run's state),
`training.continuation` (jobs across slots).

Only one reconcile runs at a time: a PostgreSQL session advisory lock (try-lock: a second
caller skips the tick instead of queueing behind it), a file lock elsewhere.
"""

import contextlib
import dataclasses
import datetime as dt
import fcntl
import logging
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings
from django.db import connection

import scheduler
from config.scheduling import policy_from_settings
from notifications import services as notices
from notifications.models import EventType
from reservations import services as reservation_services
from reservations.models import Team
from training.continuation import jobs_continue
from training.executors.base import Executor, ExecutorError, ObservedRun
from training.launch import launch, run_claim
from training.models import Run, TrainingJob, WaitingFor
from training.run_state import (
    notify_run,
    preemption_reason,
    run_end,
    run_final_state,
    run_handle,
    run_handle_record,
    run_mark_running,
    run_request_stop,
    run_stop_due,
    run_stop_sent,
    run_termination,
)
from training.snapshot import build_snapshot

logger = logging.getLogger(__name__)
RECONCILE_LOCK = (7_100_002, 1)


@dataclasses.dataclass
class TickReport:
    skipped: bool = False
    ended: list[int] = dataclasses.field(default_factory=list)
    started: list[int] = dataclasses.field(default_factory=list)
    stopped: list[int] = dataclasses.field(default_factory=list)
    killed: list[int] = dataclasses.field(default_factory=list)
    released: list[int] = dataclasses.field(default_factory=list)
    continued: dict[int, int] = dataclasses.field(default_factory=dict)  # job id → the booking it moved to
    errors: list[str] = dataclasses.field(default_factory=list)
    next_wakeup: dt.datetime | None = None


@contextlib.contextmanager
def reconcile_lock() -> Iterator[bool]:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", RECONCILE_LOCK)
            (acquired,) = cursor.fetchone()
        try:
            yield acquired
        finally:
            if acquired:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s, %s)", RECONCILE_LOCK)
        return
    path = Path(settings.VAR_DIR) / "reconcile.lock"
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def reconcile(*, now: dt.datetime, executor: Executor, policy: scheduler.Policy | None = None) -> TickReport:
    policy = policy or policy_from_settings()
    with reconcile_lock() as acquired:
        if not acquired:
            return TickReport(skipped=True)
        report = TickReport()
        advance_reservations(now=now)  # 1
        observed = record_observations(executor=executor, now=now, report=report)  # 2
        repair(executor=executor, now=now, report=report, observed=observed)  # 3
        report.continued = jobs_continue(now=now).moved  # 4
        result = scheduler.plan_detailed(build_snapshot(now=now, policy=policy), now, policy)  # 5
        apply_actions(result.actions, executor=executor, now=now, report=report)  # 6
        notify_progress(now=now, policy=policy)  # 7
        report.next_wakeup = result.next_wakeup
        return report


# --- 1. reservations ----------------------------------------------------------------------------
def advance_reservations(*, now: dt.datetime) -> None:
    reservation_services.reservations_advance(now=now)


# --- 2. observe ---------------------------------------------------------------------------------
def _team_slugs() -> list[str]:
    return list(Team.objects.values_list("slug", flat=True))


def record_observations(*, executor: Executor, now: dt.datetime, report: TickReport) -> dict[int, ObservedRun]:
    """Record what the executor says; returns its observations by run id (repair reads them)."""
    observed = {item.run_id: item for item in executor.observe(teams=_team_slugs())}
    for run in Run.objects.filter(state__in=Run.LIVE):
        seen = observed.get(run.pk)
        if seen is not None and not run.handle:  # started, but the tick that started it crashed first
            run_handle_record(run=run, handle=seen.handle)
        if seen is None:
            if run.state != Run.State.STARTING:  # it was running and is gone without a trace
                run_end(run, state=Run.State.FAILED, reason="the run vanished from the executor",
                        exit_code=None, now=now, termination=run_termination(run))
                report.ended.append(run.pk)
            continue
        if seen.state.ended:
            termination = run_termination(run)
            state, reason = run_final_state(run, seen, now, termination)
            if run_end(run, state=state, reason=reason, exit_code=seen.exit_code, now=now, termination=termination):
                report.ended.append(run.pk)
                with contextlib.suppress(ExecutorError):
                    executor.cleanup(run_handle(run))
        elif run.state == Run.State.STARTING:  # started, but the tick that started it did not record it
            run_mark_running(run=run, now=now)
    return observed


# --- 3. repair ----------------------------------------------------------------------------------
def _launch(run: Run, *, executor: Executor, now: dt.datetime, report: TickReport, token: str | None = None) -> None:
    result = launch(run, executor=executor, now=now, token=token)
    if result.outcome == "started":
        report.started.append(run.pk)
    elif result.outcome == "retry":
        report.errors.append(result.error)


def repair(
    *, executor: Executor, now: dt.datetime, report: TickReport, observed: dict[int, ObservedRun] | None = None
) -> None:
    for run in Run.objects.filter(state=Run.State.STARTING).select_related("job__image", "job__team", "node"):
        _launch(run, executor=executor, now=now, report=report)
    for run in Run.objects.filter(state=Run.State.STOPPING):
        handle = run_handle(run)
        if handle is None or not run_stop_due(run, (observed or {}).get(run.pk)):
            continue  # never started (nothing to stop), or the stop was delivered: never twice
        remaining = int(max(0, (run.kill_at - now).total_seconds())) if run.kill_at else 0
        with contextlib.suppress(ExecutorError):
            executor.stop(handle, remaining)
            run_stop_sent(run=run, now=now)


# --- 6. apply -----------------------------------------------------------------------------------
def apply_actions(actions, *, executor: Executor, now: dt.datetime, report: TickReport) -> None:
    for action in actions:
        try:
            apply_action(action, executor=executor, now=now, report=report)
        except ExecutorError as error:  # the next tick retries; one bad run must not stop the rest
            report.errors.append(f"{type(action).__name__}: {error}")
            logger.warning("reconcile: %s failed: %s", action, error)


def apply_action(action: scheduler.Action, *, executor: Executor, now: dt.datetime, report: TickReport) -> None:
    if isinstance(action, scheduler.Start):
        claimed = run_claim(action, now=now)
        if claimed is not None:
            run, token = claimed
            _launch(run, executor=executor, now=now, report=report, token=token)
    elif isinstance(action, scheduler.Stop):
        for_a_job = action.reason == scheduler.Reason.PRIORITY_PREEMPTION and action.for_job_id is not None
        # Stopped for others' sake rather than by a deadline it knew: its owner is told at once.
        preempted = for_a_job or action.reason in (scheduler.Reason.QUEUE_RELIEF, scheduler.Reason.QUEUE_DRAIN)
        # A drain keeps its plain sentence: the snapshot finds drains (and relief's budget) by it.
        reason = action.reason.sentence
        if for_a_job:
            victim_team = Run.objects.filter(pk=action.run_id).values_list("job__team_id", flat=True).first()
            reason = preemption_reason(for_job_id=action.for_job_id, victim_team_id=victim_team)
        if run_request_stop(
            run_id=action.run_id, now=now, kill_at=action.kill_at, reason=reason, stopped_for_id=action.for_job_id
        ):
            run = Run.objects.select_related("job").get(pk=action.run_id)
            if preempted:  # its owner hears why at once, not only when the checkpoint lands
                notify_run(run, EventType.RUN_PREEMPTED, now=now, reason=reason)
            handle = run_handle(run)
            if handle is not None:  # else it never started; repair stops it once its handle is known
                executor.stop(handle, int(action.grace_s))
                run_stop_sent(run=run, now=now)
            report.stopped.append(run.pk)
    elif isinstance(action, scheduler.Kill):
        run = Run.objects.filter(pk=action.run_id, state__in=Run.LIVE).first()
        if run is not None:
            Run.objects.filter(pk=run.pk).update(
                kill_at=run.kill_at or now, reason=run.reason or action.reason.sentence
            )
            handle = run_handle(run)
            if handle is not None:
                executor.kill(handle)
            report.killed.append(run.pk)
    elif isinstance(action, scheduler.Release):
        reservation_services.reservation_release(
            reservation_id=action.reservation_id, actor=None, now=now, reason=action.reason.sentence
        )
        report.released.append(action.reservation_id)


# --- 7. notices ---------------------------------------------------------------------------------
def notify_progress(*, now: dt.datetime, policy: scheduler.Policy) -> None:
    """Level-triggered notices (each is sent once; the outbox de-duplicates): a reserved run's
    slot ends soon, a queued job has waited too long."""
    soon = now + dt.timedelta(minutes=settings.GPUBOOK_REMINDER_MINUTES) + dt.timedelta(seconds=policy.grace_s)
    ending = Run.objects.filter(state=Run.State.RUNNING, kind=Run.Kind.RESERVED, must_end_by__lte=soon)
    for run in ending.select_related("job"):
        notify_run(run, EventType.RUN_ENDING_SOON, now=now)
    # One query decides which queued jobs are due a "waiting too long" notice; each is told once.
    threshold = dt.timedelta(minutes=settings.GPUBOOK_QUEUE_WAIT_NOTICE_MINUTES)
    due = TrainingJob.objects.filter(
        state=TrainingJob.State.QUEUED, reservation__isnull=True, waiting_for=WaitingFor.SLOT,
        waiting_noticed_at__isnull=True, submitted_at__lte=now - threshold,
    ).values_list("pk", "team_id", "user_id", "name", "submitted_at")
    for job_id, team_id, user_id, name, submitted_at in due:
        notices.notify_job_waiting(
            job_id=job_id, team_id=team_id, user_id=user_id, waiting_since=submitted_at, now=now,
            payload={"job": {"id": job_id, "name": name}},
        )
        TrainingJob.objects.filter(pk=job_id).update(waiting_noticed_at=now)
