"""What plan() asks the executor to do. Each action is a frozen dataclass; reasons are
plain strings a person can read in logs, notifications and the admin (`Reason.sentence`).

Applying the actions (the lead's reconcile):
* `Start`: create a Run for `job_id` on `gpu_ids` (claim by compare-and-set), store
  `must_end_by`, `kind`, `reservation_id` and `estimated_end` on it, tell the runner
  `must_end_by`, and start it.
* `Stop`: ask the run to checkpoint and exit (SIGTERM / pod deletion with
  `terminationGracePeriodSeconds = grace_s`) and record `stop_requested_at = now` so the
  next plan does not send it again. plan sends `Kill` at `kill_at` if it is still there.
* `Kill`: end it now (SIGKILL / delete the Job with no grace).
* `Release`: mark the reservation released from now on and refund its unused GPU-hours.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TypeAlias

from scheduler.snapshot import Id, Instant, RunKind


class Reason(StrEnum):
    RESERVATION_STARTING = "reservation_starting"
    SLOT_ENDING = "slot_ending"
    DEADLINE = "deadline"
    RESERVATION_GONE = "reservation_gone"
    GPU_MAINTENANCE = "gpu_maintenance"
    STOP_GRACE_OVER = "stop_grace_over"
    NO_SHOW = "no_show"
    JOB_FINISHED_EARLY = "job_finished_early"
    PRIORITY_PREEMPTION = "priority_preemption"
    QUEUE_RELIEF = "queue_relief"
    QUEUE_DRAIN = "queue_drain"

    @property
    def sentence(self) -> str:
        return _SENTENCES[self]


_SENTENCES = {
    Reason.RESERVATION_STARTING: "A reservation starts on these GPUs; the backfill run must "
    "make room.",
    Reason.SLOT_ENDING: "The reserved slot ends; the run checkpoints and resumes in its next slot.",
    Reason.DEADLINE: "The run reached its must-end-by time (time limit or quota).",
    Reason.RESERVATION_GONE: "The reservation this run belonged to was cancelled or released.",
    Reason.GPU_MAINTENANCE: "A GPU of this run went into maintenance.",
    Reason.STOP_GRACE_OVER: "The run was asked to stop and did not exit within its grace period.",
    Reason.NO_SHOW: "Nothing ran on the reservation after its start; the GPUs are released "
    "and the unused GPU-hours refunded.",
    Reason.JOB_FINISHED_EARLY: "The reserved job finished early; the rest of the slot is "
    "released and refunded.",
    Reason.PRIORITY_PREEMPTION: "A job of higher priority needs these GPUs; the run "
    "checkpoints and is queued again to resume.",
    Reason.QUEUE_RELIEF: "Queued jobs have waited over the relief threshold with no room, and "
    "this run's GPUs start the most of them; the run checkpoints and is queued again to resume.",
    Reason.QUEUE_DRAIN: "The oldest queued job that needs a whole node has waited over the drain "
    "threshold; this run's node is emptied for it, and the run checkpoints and is queued again "
    "to resume.",
}


@dataclass(frozen=True, slots=True)
class Start:
    job_id: Id
    gpu_ids: tuple[Id, ...]
    must_end_by: Instant | None
    kind: RunKind
    reservation_id: Id | None = None
    # When backfill expects the run to finish (None for reserved runs and unknown estimates).
    estimated_end: Instant | None = None
    # True when the job starts although its estimate does not fit before the next
    # reservation: it will be stopped with grace and requeued when that reservation comes.
    preemptible: bool = False


@dataclass(frozen=True, slots=True)
class Stop:
    run_id: Id
    reason: Reason
    grace_s: float
    kill_at: Instant
    # PRIORITY_PREEMPTION and QUEUE_DRAIN: the queued job the GPUs are freed for, so the
    # stopped run's owner can be told who took them (and a drain's target is remembered).
    for_job_id: Id | None = None


@dataclass(frozen=True, slots=True)
class Kill:
    run_id: Id
    reason: Reason


@dataclass(frozen=True, slots=True)
class Release:
    reservation_id: Id
    reason: Reason


Action: TypeAlias = Start | Stop | Kill | Release
