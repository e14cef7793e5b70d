"""A run's state changes and its executor handle, in one place.

Every move of a run goes through a function here, each a compare-and-set on the run's state
so two ticks (or a tick and a page) never both make it:
- `run_request_stop`: live → STOPPING with when, why and a kill deadline. Reconcile (slot
  end, preemption), `job_cancel` and the watchdog all ask through it; none calls the executor
  (no network inside a transaction): reconcile delivers the stop.
- `run_mark_running`: STARTING → RUNNING once the executor has it.
- `run_end`: live → ended, and the job moves on (finished, or waiting for its next slot).

The handle is what the executor's `start` returned, stored on the Run as `Handle.as_dict()`;
every caller that talks to the executor about a run (reconcile, repair, the API, the pages)
reads it through `run_handle`. Nobody rebuilds one by hand: a Kubernetes handle carries the
namespace the Job was created in, which only the executor knows.
"""

import datetime as dt
from pathlib import Path

from django.db import transaction
from django.db.models import F

import scheduler
from notifications import services as notices
from notifications.models import EventType
from training.executors.base import Handle, ObservedRun, RunState
from training.models import Run, TrainingJob
from training.runner.termination import read_termination


# --- the handle ---------------------------------------------------------------------------------
def run_handle(run: Run) -> Handle | None:
    """The handle the executor gave for this run, or None if it was never started (or the
    tick that started it crashed before recording it; observing the run records it then)."""
    return Handle.from_dict(run.handle) if run.handle else None


def run_handle_record(*, run: Run, handle: Handle) -> None:
    """Store the executor's handle on the run (idempotent: a repeated start returns the same)."""
    data = handle.as_dict()
    if run.handle != data:
        Run.objects.filter(pk=run.pk).update(handle=data)
        run.handle = data


# --- stop ---------------------------------------------------------------------------------------
def run_request_stop(
    *, run_id: int, now: dt.datetime, kill_at: dt.datetime, reason: str, only_running: bool = False,
    stopped_for_id: int | None = None,
) -> bool:
    """Ask a live run to checkpoint and end: STOPPING, with when it was asked, when it will be
    killed and a sentence saying why (shown on the run page). Compare-and-set: a run already
    asked keeps its first request. `only_running`: leave a run that is still starting alone.
    `stopped_for_id`: the queued job it makes room for (a queue drain reads it back)."""
    states = (Run.State.RUNNING,) if only_running else (Run.State.STARTING, Run.State.RUNNING)
    return bool(
        Run.objects.filter(pk=run_id, state__in=states, stop_requested_at__isnull=True).update(
            state=Run.State.STOPPING, stop_requested_at=now, kill_at=kill_at, reason=reason[:500],
            stopped_for_id=stopped_for_id,
        )
    )


def preemption_reason(*, for_job_id: int, victim_team_id: int) -> str:
    """Why a backfill run is stopped by priority preemption, naming the job that takes its GPUs.
    A job of another team is named by its priority and team only, as the queue page shows it."""
    taker = TrainingJob.objects.select_related("team").filter(pk=for_job_id).first()
    if taker is None:  # cancelled meanwhile: the plan's general sentence is all there is
        return scheduler.Reason.PRIORITY_PREEMPTION.sentence
    article = "an" if taker.priority == scheduler.Priority.URGENT else "a"
    who = (f"the {taker.priority} job “{taker.name}” (#{taker.pk})" if taker.team_id == victim_team_id
           else f"{article} {taker.priority} job of team {taker.team.name}")
    return f"Stopped to make room for {who}; it checkpoints and is queued again to resume."


def run_stop_sent(*, run: Run, now: dt.datetime) -> None:
    """The executor took the stop: record it, so it is not sent again (a second SIGTERM
    reaching a runner that is saving must never turn its checkpoint into a failure)."""
    Run.objects.filter(pk=run.pk).update(stop_sent_at=now, stops_sent=F("stops_sent") + 1)
    run.stop_sent_at, run.stops_sent = now, run.stops_sent + 1


# Observed reasons that prove a stop sent earlier cannot have reached the run: the local
# supervisor that was to forward it is gone (the executor then signals the run itself).
STOP_RECEIVER_LOST = frozenset({"supervisor-lost"})


def run_stop_due(run: Run, observed: ObservedRun | None) -> bool:
    """Must a stop (still) be sent to this STOPPING run? Once, and once more only when the
    first provably did not arrive."""
    if run.stops_sent == 0:
        return True
    return run.stops_sent == 1 and observed is not None and observed.reason in STOP_RECEIVER_LOST


# --- start --------------------------------------------------------------------------------------
def run_mark_running(*, run: Run, now: dt.datetime) -> bool:
    """STARTING → RUNNING; False if it was already recorded (or stopped meanwhile)."""
    return bool(
        Run.objects.filter(pk=run.pk, state=Run.State.STARTING).update(
            state=Run.State.RUNNING, started_at=run.started_at or now
        )
    )


# --- end ----------------------------------------------------------------------------------------
def run_termination(run: Run) -> dict | None:
    """The runner's termination message for this run, if it wrote one (the job's output dir is
    shared by its runs, so an earlier run's message does not count)."""
    termination = read_termination(Path(run.output_dir)) if run.output_dir else None
    return termination if termination and str(termination.get("run_id")) == str(run.pk) else None


def checkpoint_readable(path: str | None) -> bool:
    """A checkpoint file that is there, non-empty and readable by us."""
    if not path:
        return False
    try:
        with open(path, "rb") as handle:
            return bool(handle.read(1))
    except OSError:
        return False


def run_final_state(run: Run, observed: ObservedRun, now: dt.datetime, termination: dict | None) -> tuple[str, str]:
    """What an ended run is called, and why. A run whose runner says it checkpointed, with a
    checkpoint we can read, is checkpointed whatever signal it died of afterwards: the work
    is saved and the job resumes from it."""
    reason = (termination or {}).get("reason") or observed.detail or observed.reason
    if observed.state == RunState.SUCCEEDED:
        return Run.State.SUCCEEDED, "finished"
    if observed.state == RunState.CHECKPOINTED:
        return Run.State.CHECKPOINTED, run.reason or reason or "stopped with a checkpoint"
    if (termination or {}).get("status") == "checkpointed" and checkpoint_readable(termination.get("checkpoint")):
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


def _job_runtime_s(job_id: int) -> float:
    total = 0.0
    for started, ended in Run.objects.filter(job_id=job_id).values_list("started_at", "ended_at"):
        if started and ended:
            total += (ended - started).total_seconds()
    return total


def run_end(
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
        notify_run(run, event, now=now, reason=reason)  # the outbox row commits with the run's end
    return True


def notify_run(run: Run, event_type: str, *, now: dt.datetime, reason: str = "") -> None:
    """A run event for its owner, through the outbox (de-duplicated per run and event)."""
    job = run.job
    notices.notify_run_event(
        run_id=run.pk, event_type=event_type, team_id=job.team_id, user_id=job.user_id, now=now,
        payload={"job": {"id": job.pk, "name": job.name}, "gpus": list(run.gpu_ids),
                 "must_end_by": run.must_end_by.isoformat(), "reason": reason,
                 "metrics": {key: value for key, value in (run.progress or {}).items() if key not in {"event", "at"}}},
    )
