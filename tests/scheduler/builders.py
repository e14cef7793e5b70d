"""Small builders for snapshots in tests: defaults for everything a test does not care about.

Times are float seconds (the simulator's kind) unless a test is about datetimes.
Personas: team "vision" (alice, bob) and team "speech" (carol).
"""

from __future__ import annotations

from dataclasses import replace

from scheduler import (
    Gpu,
    GpuState,
    Kill,
    Priority,
    QueuedJob,
    Release,
    Reservation,
    ReservationStatus,
    Run,
    RunKind,
    Snapshot,
    Start,
    Stop,
)
from scheduler.actions import Action

GRACE_S = 60.0


def gpus(nodes: int = 2, per_node: int = 8, states: dict[int, GpuState] | None = None
         ) -> tuple[Gpu, ...]:
    """GPU ids are node * 100 + index, so a test can read the node off an id."""
    states = states or {}
    return tuple(
        Gpu(id=node * 100 + index, node=node, index=index,
            state=states.get(node * 100 + index, GpuState.ACTIVE))
        for node in range(nodes)
        for index in range(per_node)
    )


def reservation(
    reservation_id: int,
    gpu_ids: tuple[int, ...],
    start: float,
    end: float,
    *,
    job_id: int | None = None,
    team: str = "vision",
    user: str = "alice",
    status: ReservationStatus = ReservationStatus.CONFIRMED,
    job_finished: bool = False,
) -> Reservation:
    return Reservation(
        id=reservation_id, gpu_ids=gpu_ids, start=start, end=end, team=team, user=user,
        status=status, job_id=job_id, job_finished=job_finished,
    )


def job(
    job_id: int,
    gpus_needed: int = 1,
    *,
    submitted_at: float = 0.0,
    team: str = "vision",
    user: str = "alice",
    priority: Priority = Priority.MEDIUM,
    estimate_s: float | None = 600.0,
    checkpointable: bool = True,
    times_preempted: int = 0,
    timeout_s: float | None = None,
) -> QueuedJob:
    return QueuedJob(
        id=job_id, team=team, user=user, gpus_needed=gpus_needed, submitted_at=submitted_at,
        priority=priority, estimated_duration_s=estimate_s, checkpointable=checkpointable,
        times_preempted=times_preempted, timeout_s=timeout_s,
    )


def run(
    run_id: int,
    gpu_ids: tuple[int, ...],
    *,
    job_id: int | None = None,
    kind: RunKind = RunKind.BACKFILL,
    started_at: float = 0.0,
    must_end_by: float | None = None,
    reservation_id: int | None = None,
    stop_requested_at: float | None = None,
    estimated_end: float | None = None,
    team: str = "vision",
    user: str = "alice",
    priority: Priority = Priority.MEDIUM,
    checkpointable: bool = True,
    times_preempted: int = 0,
) -> Run:
    return Run(
        id=run_id, job_id=job_id if job_id is not None else 1000 + run_id, gpu_ids=gpu_ids,
        kind=kind, started_at=started_at, team=team, user=user,
        reservation_id=reservation_id, must_end_by=must_end_by,
        stop_requested_at=stop_requested_at, estimated_end=estimated_end, priority=priority,
        checkpointable=checkpointable, times_preempted=times_preempted,
    )


def snapshot(**parts) -> Snapshot:
    parts.setdefault("gpus", gpus())
    return Snapshot(**parts)


def of_type(actions: list[Action], kind: type) -> list:
    return [action for action in actions if isinstance(action, kind)]


def apply(snapshot_before: Snapshot, actions: list[Action], now: float) -> Snapshot:
    """A minimal action applier, as reconcile would do it: stops are recorded, kills and
    releases remove, starts add runs (ids 900+)."""
    runs = {run.id: run for run in snapshot_before.runs}
    reservations = {item.id: item for item in snapshot_before.reservations}
    queued = {item.id: item for item in snapshot_before.queued_jobs}
    next_id = 900 + len(runs)
    for action in actions:
        if isinstance(action, Stop):
            runs[action.run_id] = replace(runs[action.run_id], stop_requested_at=now)
        elif isinstance(action, Kill):
            del runs[action.run_id]
        elif isinstance(action, Release):
            reservations[action.reservation_id] = replace(
                reservations[action.reservation_id], status=ReservationStatus.RELEASED
            )
        elif isinstance(action, Start):
            next_id += 1
            source = queued.pop(action.job_id, None)
            team = source.team if source else "vision"
            user = source.user if source else "alice"
            runs[next_id] = Run(
                id=next_id, job_id=action.job_id, gpu_ids=action.gpu_ids, kind=action.kind,
                started_at=now, team=team, user=user, reservation_id=action.reservation_id,
                must_end_by=action.must_end_by, estimated_end=action.estimated_end,
            )
    return replace(
        snapshot_before,
        runs=tuple(runs.values()),
        reservations=tuple(reservations.values()),
        queued_jobs=tuple(queued.values()),
    )
