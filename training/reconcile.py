"""reconcile(now): make the world match the plan, one level-triggered, idempotent tick.

Steps (STYLE.md habit 5; each can crash and the next tick repairs it):
1. advance reservation statuses along the clock;
2. observe the executor and record what ended (runs, then their jobs);
3. repair: start claimed runs the executor does not know (crash between claim and start),
   re-deliver stops to runs that are still running (crash between claim and stop);
4. snapshot the database → `scheduler.plan_detailed(snapshot, now, policy)`;
5. apply each action: claim it in the database with compare-and-set and commit, then call
   the executor — never inside a transaction.

Only one reconcile runs at a time: a PostgreSQL session advisory lock (try-lock: a second
caller skips the tick instead of queueing behind it), a file lock elsewhere.
"""

import contextlib
import dataclasses
import datetime as dt
import fcntl
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, connection, transaction

import scheduler
from gpus.models import Gpu
from notifications import services as notices
from notifications.models import EventType
from reservations import selectors as reservation_selectors
from reservations import services as reservation_services
from reservations.models import Reservation, Team
from reservations.timegrid import month_start, next_month_start
from training.advice import yolo_for_run
from training.executors.base import (
    Executor,
    ExecutorError,
    ExecutorUnavailable,
    ObservedRun,
    RunSpec,
    RunState,
)
from training.models import Run, TrainingJob
from training.run_state import run_handle, run_handle_record
from training.runner.termination import read_termination

logger = logging.getLogger(__name__)
RECONCILE_LOCK = (7_100_002, 1)
USAGE_WINDOW = dt.timedelta(days=28)  # four half-lives: older usage weighs < 7 %
# A backfill run with no reservation ahead and no time limit still gets a hard end, so the
# executors' backstop (activeDeadlineSeconds, the local supervisor's timer) is always set.
UNBOUNDED_RUN_S = 30 * 86400


@dataclasses.dataclass
class TickReport:
    skipped: bool = False
    ended: list[int] = dataclasses.field(default_factory=list)
    started: list[int] = dataclasses.field(default_factory=list)
    stopped: list[int] = dataclasses.field(default_factory=list)
    killed: list[int] = dataclasses.field(default_factory=list)
    released: list[int] = dataclasses.field(default_factory=list)
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


def policy_from_settings() -> scheduler.Policy:
    return scheduler.Policy(
        grace_s=float(settings.GPUBOOK_STOP_GRACE_SECONDS),
        no_show_after_s=float(settings.GPUBOOK_NO_SHOW_MINUTES * 60),
        usage_factor=settings.GPUBOOK_BACKFILL_USAGE_FACTOR,
    )


def reconcile(*, now: dt.datetime, executor: Executor, policy: scheduler.Policy | None = None) -> TickReport:
    policy = policy or policy_from_settings()
    with reconcile_lock() as acquired:
        if not acquired:
            return TickReport(skipped=True)
        report = TickReport()
        reservation_services.reservations_advance(now=now)
        record_observations(executor=executor, now=now, report=report)
        repair(executor=executor, now=now, report=report)
        result = scheduler.plan_detailed(build_snapshot(now=now, policy=policy), now, policy)
        for action in result.actions:
            try:
                apply_action(action, executor=executor, now=now, report=report)
            except ExecutorError as error:  # the next tick retries; one bad run must not stop the rest
                report.errors.append(f"{type(action).__name__}: {error}")
                logger.warning("reconcile: %s failed: %s", action, error)
        notify_progress(now=now, policy=policy)
        report.next_wakeup = result.next_wakeup
        return report


# --- 2. observe ---------------------------------------------------------------------------------
def _termination(run: Run) -> dict | None:
    """The runner's termination message for this run, if it wrote one (the job's output dir is
    shared by its runs, so an earlier run's message does not count)."""
    termination = read_termination(Path(run.output_dir)) if run.output_dir else None
    return termination if termination and str(termination.get("run_id")) == str(run.pk) else None


def _final_state(run: Run, observed: ObservedRun, now: dt.datetime, termination: dict | None) -> tuple[str, str]:
    """What an ended run is called, and why."""
    reason = (termination or {}).get("reason") or observed.detail or observed.reason
    if observed.state == RunState.SUCCEEDED:
        return Run.State.SUCCEEDED, "finished"
    if observed.state == RunState.CHECKPOINTED:
        return Run.State.CHECKPOINTED, run.reason or reason or "stopped with a checkpoint"
    if run.kill_at is not None and now >= run.kill_at:  # we killed it: its exit code says SIGKILL
        return Run.State.KILLED, run.reason or "killed at its deadline"
    if observed.state == RunState.FAILED:
        return Run.State.FAILED, reason or f"exit code {observed.exit_code}"
    if observed.state == RunState.STOPPED:
        if termination and termination.get("status") == "checkpointed":
            return Run.State.CHECKPOINTED, run.reason or "stopped with a checkpoint"
        return Run.State.KILLED, run.reason or "stopped"
    return Run.State.FAILED, f"the run vanished ({observed.reason or 'no exit status'})"


def _end_run(
    run: Run, *, state: str, reason: str, exit_code: int | None, now: dt.datetime, termination: dict | None = None
) -> bool:
    """Record a run's end and move its job on. Compare-and-set: only one tick records it."""
    checkpoint = (termination or {}).get("checkpoint")
    with transaction.atomic():
        ended = Run.objects.filter(pk=run.pk, state__in=Run.LIVE).update(
            state=state, reason=reason[:500], exit_code=exit_code, ended_at=now, checkpoint_path=checkpoint or ""
        )
        if not ended:
            return False
        job = TrainingJob.objects.select_for_update().get(pk=run.job_id)
        if job.state in TrainingJob.FINISHED:
            return True  # cancelled meanwhile: it stays cancelled
        if state == Run.State.SUCCEEDED:
            job.state, job.finished_at, job.reason = TrainingJob.State.SUCCEEDED, now, ""
        elif state == Run.State.FAILED:
            job.state, job.finished_at, job.reason = TrainingJob.State.FAILED, now, reason[:500]
        elif job.timeout_s and _job_runtime_s(job.pk) >= job.timeout_s:
            job.state, job.finished_at, job.reason = TrainingJob.State.FAILED, now, "timed out"
            Run.objects.filter(pk=run.pk).update(state=Run.State.TIMED_OUT)
        else:  # checkpointed or killed at a slot edge: resumable, waits for its next slot or idle GPUs
            job.state = TrainingJob.State.QUEUED
            if checkpoint:
                job.checkpoint_path = checkpoint
            if run.kind == Run.Kind.BACKFILL and run.stop_requested_at is not None:
                job.times_preempted += 1
        job.save()
        event = {Run.State.SUCCEEDED: EventType.RUN_FINISHED, Run.State.FAILED: EventType.RUN_FAILED,
                 Run.State.TIMED_OUT: EventType.RUN_FAILED}.get(state, EventType.RUN_CHECKPOINTED)
        _notify_run(run, event, now=now, reason=reason)  # the outbox row commits with the run's end
    return True


def _notify_run(run: Run, event_type: str, *, now: dt.datetime, reason: str = "") -> None:
    job = run.job
    notices.notify_run_event(
        run_id=run.pk, event_type=event_type, team_id=job.team_id, user_id=job.user_id, now=now,
        payload={"job": {"id": job.pk, "name": job.name}, "gpus": list(run.gpu_ids),
                 "must_end_by": run.must_end_by.isoformat(), "reason": reason,
                 "metrics": {key: value for key, value in (run.progress or {}).items() if key not in {"event", "at"}}},
    )


def notify_progress(*, now: dt.datetime, policy: scheduler.Policy) -> None:
    """Level-triggered notices (each is sent once; the outbox de-duplicates): a reserved run's
    slot ends soon, a queued job has waited too long."""
    soon = now + dt.timedelta(minutes=settings.GPUBOOK_REMINDER_MINUTES) + dt.timedelta(seconds=policy.grace_s)
    ending = Run.objects.filter(state=Run.State.RUNNING, kind=Run.Kind.RESERVED, must_end_by__lte=soon)
    for run in ending.select_related("job"):
        _notify_run(run, EventType.RUN_ENDING_SOON, now=now)
    for job in TrainingJob.objects.filter(state=TrainingJob.State.QUEUED, reservation__isnull=True):
        notices.notify_job_waiting(
            job_id=job.pk, team_id=job.team_id, user_id=job.user_id, waiting_since=job.submitted_at, now=now,
            payload={"job": {"id": job.pk, "name": job.name}},
        )


def _job_runtime_s(job_id: int) -> float:
    total = 0.0
    for started, ended in Run.objects.filter(job_id=job_id).values_list("started_at", "ended_at"):
        if started and ended:
            total += (ended - started).total_seconds()
    return total


def _team_slugs() -> list[str]:
    return list(Team.objects.values_list("slug", flat=True))


def record_observations(*, executor: Executor, now: dt.datetime, report: TickReport) -> None:
    observed = {item.run_id: item for item in executor.observe(teams=_team_slugs())}
    for run in Run.objects.filter(state__in=Run.LIVE):
        seen = observed.get(run.pk)
        if seen is not None and not run.handle:  # started, but the tick that started it crashed first
            run_handle_record(run=run, handle=seen.handle)
        if seen is None:
            if run.state != Run.State.STARTING:  # it was running and is gone without a trace
                _end_run(run, state=Run.State.FAILED, reason="the run vanished from the executor",
                         exit_code=None, now=now, termination=_termination(run))
                report.ended.append(run.pk)
            continue
        if seen.state.ended:
            termination = _termination(run)
            state, reason = _final_state(run, seen, now, termination)
            if _end_run(run, state=state, reason=reason, exit_code=seen.exit_code, now=now, termination=termination):
                report.ended.append(run.pk)
                with contextlib.suppress(ExecutorError):
                    executor.cleanup(run_handle(run))
        elif run.state == Run.State.STARTING:  # started, but the tick that started it did not record it
            Run.objects.filter(pk=run.pk, state=Run.State.STARTING).update(
                state=Run.State.RUNNING, started_at=run.started_at or now
            )


# --- 3. repair ----------------------------------------------------------------------------------
def repair(*, executor: Executor, now: dt.datetime, report: TickReport) -> None:
    for run in Run.objects.filter(state=Run.State.STARTING).select_related("job__image", "job__team", "node"):
        _launch(run, executor=executor, now=now, report=report)
    for run in Run.objects.filter(state=Run.State.STOPPING):
        handle = run_handle(run)
        if handle is None:  # never started: nothing to stop
            continue
        remaining = int(max(0, (run.kill_at - now).total_seconds())) if run.kill_at else 0
        with contextlib.suppress(ExecutorError):
            executor.stop(handle, remaining)  # a repeated SIGTERM is harmless


# --- 4. snapshot --------------------------------------------------------------------------------
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


def backfill_usage_seconds(*, team_id: int, window_start: dt.datetime, window_end: dt.datetime, factor: float) -> float:
    """GPU-seconds of the team's backfill runs inside the window, at the usage factor."""
    total = 0.0
    for started, ended, gpu_ids in Run.objects.filter(
        job__team_id=team_id, kind=Run.Kind.BACKFILL, started_at__lt=window_end
    ).values_list("started_at", "ended_at", "gpu_ids"):
        end = min(ended or window_end, window_end)
        total += max(0.0, (end - max(started, window_start)).total_seconds()) * len(gpu_ids) * factor
    return total


def _team_accounts(*, now: dt.datetime, policy: scheduler.Policy) -> tuple[scheduler.TeamAccount, ...]:
    accounts = []
    for team in Team.objects.all():
        month = reservation_selectors.team_month_usage(team=team, now=now)
        backfill = backfill_usage_seconds(
            team_id=team.pk, window_start=month_start(now, team.tzinfo), window_end=next_month_start(now, team.tzinfo),
            factor=policy.usage_factor,
        )
        remaining = team.monthly_gpu_hours * 3600 - month["used_gpu_hours"] * 3600 - backfill
        accounts.append(
            scheduler.TeamAccount(
                team=team.pk, share=team.fair_share or float(team.monthly_gpu_hours or 1),
                quota_remaining_gpu_s=max(0.0, remaining),
            )
        )
    return tuple(accounts)


# --- 5. apply -----------------------------------------------------------------------------------
def apply_action(action: scheduler.Action, *, executor: Executor, now: dt.datetime, report: TickReport) -> None:
    if isinstance(action, scheduler.Start):
        run = _claim_start(action, now=now)
        if run is not None:
            _launch(run, executor=executor, now=now, report=report)
    elif isinstance(action, scheduler.Stop):
        claimed = Run.objects.filter(pk=action.run_id, state__in=Run.LIVE, stop_requested_at__isnull=True).update(
            state=Run.State.STOPPING, stop_requested_at=now, kill_at=action.kill_at, reason=action.reason.sentence
        )
        if claimed:
            run = Run.objects.get(pk=action.run_id)
            handle = run_handle(run)
            if handle is not None:  # else it never started; repair stops it once its handle is known
                executor.stop(handle, int(action.grace_s))
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


def _claim_start(action: scheduler.Start, *, now: dt.datetime) -> Run | None:
    """Write the intent (job running, run starting) and commit, before any executor call.
    The job's state flip is the compare-and-set; the one-live-run-per-job constraint backs it."""
    try:
        with transaction.atomic():
            if not TrainingJob.objects.filter(pk=action.job_id, state=TrainingJob.State.QUEUED).update(
                state=TrainingJob.State.RUNNING
            ):
                return None
            gpus = list(Gpu.objects.filter(pk__in=action.gpu_ids).order_by("index"))
            job = TrainingJob.objects.select_related("team").get(pk=action.job_id)
            run = Run(
                job=job, kind=str(action.kind), reservation_id=action.reservation_id, node_id=gpus[0].node_id,
                gpu_ids=[gpu.pk for gpu in gpus], gpu_indices=[gpu.index for gpu in gpus], created_at=now,
                must_end_by=action.must_end_by or now + dt.timedelta(seconds=job.timeout_s or UNBOUNDED_RUN_S),
                estimated_end=action.estimated_end, preemptible=action.preemptible,
                resumed_from=job.checkpoint_path,
                output_dir=str(Path(settings.GPUBOOK_RUNS_DIR) / f"job-{job.pk}"),
            )
            run.save()
            return run
    except IntegrityError:
        return None  # another reconciler claimed it first


def runner_spec(run: Run, token: str) -> dict:
    """The runner's spec for a YOLO job's run (training/runner/spec.py)."""
    yolo = run.job.spec["yolo"]
    resolved = yolo_for_run(run)  # the image's defaults, the batch for these GPUs (issue #17)
    return {
        "run_id": str(run.pk), "model": yolo["model"], "data": yolo["data"], "epochs": resolved.epochs,
        "imgsz": resolved.imgsz, "batch": resolved.batch, "export": list(resolved.export),
        "device": list(range(len(run.gpu_indices))) if settings.GPUBOOK_RUNNER_DEVICE == "cuda" else "cpu",
        "workers": settings.GPUBOOK_RUNNER_WORKERS, "output_dir": run.output_dir,
        "resume_from": run.resumed_from or None, "must_end_by": run.must_end_by.isoformat(),
        "grace_s": settings.GPUBOOK_STOP_GRACE_SECONDS, "extra": dict(resolved.extra),
        "allow_gpu_count_change": bool(yolo.get("allow_gpu_count_change", False)),
        "report_url": f"{settings.GPUBOOK_BASE_URL}/api/v1/runs/{run.pk}/report/", "report_token": token,
    }


def runner_argv(run: Run) -> list[str]:
    """A YOLO job runs our runner with a spec file in its output dir; a command job its own argv."""
    if not run.job.is_yolo:
        return list(run.job.argv)
    spec_path = Path(run.output_dir) / f"spec-run-{run.pk}.json"
    return [settings.GPUBOOK_RUNNER_PYTHON or sys.executable, "-m", "training.runner", "--spec", str(spec_path)]


def _write_runner_spec(run: Run, token: str) -> None:
    if not run.job.is_yolo:
        return
    output_dir = Path(run.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    spec_path = output_dir / f"spec-run-{run.pk}.json"
    spec_path.write_text(json.dumps(runner_spec(run, token), indent=2))
    spec_path.chmod(0o600)  # it holds the run's report token


def run_spec_for(run: Run) -> RunSpec:
    job = run.job
    resources = job.spec.get("resources") or {}
    return RunSpec(
        run_id=run.pk, image=settings.GPUBOOK_IMAGE_REGISTRY + job.image.reference, argv=tuple(runner_argv(run)),
        node_name=run.node.name, gpu_indices=tuple(run.gpu_indices), team=job.team.slug, job_id=job.pk,
        reservation_id=run.reservation_id, must_end_by=run.must_end_by,
        grace_s=int(settings.GPUBOOK_STOP_GRACE_SECONDS), output_dir=run.output_dir, workdir=str(settings.BASE_DIR),
        memory=str(resources["memory"]) if resources.get("memory") else None,
        cpu=str(resources["cpu"]) if resources.get("cpu") else None,
    )


def _launch(run: Run, *, executor: Executor, now: dt.datetime, report: TickReport) -> None:
    if run.must_end_by <= now:
        _end_run(run, state=Run.State.CANCELLED, reason="its slot ended before it could start", exit_code=None, now=now)
        return
    token = run.issue_report_token()
    Run.objects.filter(pk=run.pk).update(report_token_hash=run.report_token_hash)
    try:
        _write_runner_spec(run, token)
        handle = executor.start(run_spec_for(run), now=now)
    except ExecutorUnavailable as error:
        report.errors.append(f"run {run.pk}: {error}")  # stays STARTING; the next tick retries
        return
    except (ExecutorError, ValueError, OSError) as error:
        _end_run(run, state=Run.State.FAILED, reason=f"could not start: {error}", exit_code=None, now=now)
        return
    run_handle_record(run=run, handle=handle)
    if Run.objects.filter(pk=run.pk, state=Run.State.STARTING).update(state=Run.State.RUNNING, started_at=now):
        _notify_run(run, EventType.RUN_STARTED, now=now)
    report.started.append(run.pk)
