"""The frozen picture of the cluster that `plan()` reasons about.

reconcile builds one `Snapshot` per tick from the database (the simulator builds one from
its own state) and hands it to `scheduler.plan`. Nothing here knows about Django; every
type is a frozen dataclass so a plan can never change its input.

How to build a snapshot (the contract for the DB adapter):

* **Ids** are whatever the database uses (ints in gpubook, strs are fine too); ids of one
  kind must be of one type so they sort.
* **Times** (`Instant`) are timezone-aware UTC `datetime`s in the real system. The simulator
  passes float seconds instead because it replays millions of events; never mix the two in
  one snapshot. `now` passed to `plan` must be of the same kind. Durations are always
  float seconds (`*_s` fields).
* `gpus`: every GPU of the inventory, with its node, its index on the node and its state.
  Only `active` GPUs receive new runs; runs on a GPU in `maintenance` are stopped with
  grace; `drained` GPUs keep their runs but get no new ones.
* `reservations`: every reservation whose status is `confirmed` or `active` and whose `end`
  is after `now` (others may be included; they are ignored by status). `job_id` is the
  attached training job or None; `job_finished` is True once that job has ended for good
  (succeeded, failed, cancelled), which is what lets the rest of the slot be released.
* `queued_jobs`: jobs waiting for backfill (queued, not attached to a reservation, not
  running). `estimated_duration_s` is the user's estimate, or the one from
  `scheduler.estimate`, or None (then `Policy.default_estimate_s`). A job whose run is
  still in `runs` is never started twice even if it is also listed here.
* `runs`: every run that holds GPUs now (starting, running, or asked to stop but not yet
  gone). `stop_requested_at` is set by the action applier when it delivers a `Stop`, so
  the next plan does not send it again. `estimated_end` is copied from `Start` and lets
  backfill predict when a node frees up.
* `usage`: recent GPU usage of finished runs as exponentially decayed GPU-seconds, per
  (team, user), valid at `as_of`; plan decays it further to `now`. Several records per
  pair are summed, so the adapter may pass one per finished run or one per day. Usage of
  the runs in `runs` is added by plan itself.
* `teams`: fair-share share, remaining quota and the admin's over-quota permission per
  team. A team without an account gets `Policy.default_team_share` and no quota limit.
* `relief_history`: queue relief's past within the last `Policy.relief_budget_window_s`:
  when relief asked runs to stop, and how many jobs were submitted to the queue (not to a
  booking). Its budget reads it; the default (nothing recorded) leaves relief unbounded but
  for `Policy.relief_budget_extra`. A queue drain's stops count there too (they share its
  budget).
* `drains`: queue drains (scheduler.queue_drain) within the relief budget window whose job
  is still queued and has not started since: when each asked a run to stop, the job it was
  for, and the stopped run's GPUs. The latest names the drain target; the adapter keeps
  them with the stopped run (the default, none, means no target yet).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TypeAlias

Id: TypeAlias = int | str
Instant: TypeAlias = datetime | float


class GpuState(StrEnum):
    ACTIVE = "active"
    DRAINED = "drained"
    MAINTENANCE = "maintenance"


class Priority(StrEnum):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    URGENT = "urgent"


class RunKind(StrEnum):
    RESERVED = "reserved"
    BACKFILL = "backfill"


class ReservationStatus(StrEnum):
    PENDING = "pending"  # waiting for a team manager's approval (the word Django uses)
    CONFIRMED = "confirmed"
    ACTIVE = "active"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    RELEASED = "released"


LIVE_RESERVATION_STATUSES = frozenset({ReservationStatus.CONFIRMED, ReservationStatus.ACTIVE})


@dataclass(frozen=True, slots=True)
class Gpu:
    id: Id
    node: Id
    index: int
    state: GpuState = GpuState.ACTIVE


@dataclass(frozen=True, slots=True)
class Reservation:
    id: Id
    gpu_ids: tuple[Id, ...]
    start: Instant
    end: Instant
    team: Id
    user: Id
    status: ReservationStatus = ReservationStatus.CONFIRMED
    job_id: Id | None = None
    job_finished: bool = False


@dataclass(frozen=True, slots=True)
class QueuedJob:
    id: Id
    team: Id
    user: Id
    gpus_needed: int
    submitted_at: Instant
    priority: Priority = Priority.MEDIUM
    estimated_duration_s: float | None = None
    checkpointable: bool = True
    times_preempted: int = 0
    # The job's own time limit; its run gets must_end_by no later than start + timeout.
    timeout_s: float | None = None


@dataclass(frozen=True, slots=True)
class Run:
    id: Id
    job_id: Id
    gpu_ids: tuple[Id, ...]
    kind: RunKind
    started_at: Instant
    team: Id
    user: Id
    reservation_id: Id | None = None
    must_end_by: Instant | None = None
    stop_requested_at: Instant | None = None
    estimated_end: Instant | None = None
    priority: Priority = Priority.MEDIUM
    # Whether the job saves a checkpoint on Stop (the YOLO runner does): priority
    # preemption stops such runs first, since the others lose all their work.
    checkpointable: bool = True
    # How often the job's backfill runs were stopped before they finished (bookings, urgent
    # jobs, relief): queue relief stops a job at most once.
    times_preempted: int = 0


@dataclass(frozen=True, slots=True)
class Usage:
    team: Id
    user: Id
    gpu_seconds: float
    as_of: Instant


@dataclass(frozen=True, slots=True)
class TeamAccount:
    team: Id
    # Relative weight; gpubook derives it from the monthly quota unless an admin set it.
    share: float | None = None
    # GPU-seconds left this month (already net of bookings); None means no limit.
    quota_remaining_gpu_s: float | None = None
    # An admin may let a team past its quota run queued jobs on idle GPUs at lowest priority.
    over_quota_allowed: bool = False


@dataclass(frozen=True, slots=True)
class ReliefHistory:
    stops: tuple[Instant, ...] = ()
    jobs_submitted: int = 0


@dataclass(frozen=True, slots=True)
class Drain:
    at: Instant
    job_id: Id
    gpu_ids: tuple[Id, ...]


@dataclass(frozen=True, slots=True)
class Snapshot:
    gpus: tuple[Gpu, ...]
    reservations: tuple[Reservation, ...] = ()
    queued_jobs: tuple[QueuedJob, ...] = ()
    runs: tuple[Run, ...] = ()
    usage: tuple[Usage, ...] = ()
    teams: tuple[TeamAccount, ...] = ()
    relief_history: ReliefHistory = ReliefHistory()
    drains: tuple[Drain, ...] = ()
