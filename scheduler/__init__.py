"""gpubook's scheduling core: pure functions over frozen snapshots, no Django, no clock.

`plan(snapshot, now, policy)` is the entry point; see `scheduler.snapshot` for what a
snapshot holds, `scheduler.actions` for what comes back, `scheduler.policy` for the knobs,
and `scheduler.sim` for the trace-replay simulator (which the core never imports).
"""

from scheduler.actions import Action, Kill, Reason, Release, Start, Stop
from scheduler.estimate import PastRun, estimate_duration_s, estimate_from_recent, size_class
from scheduler.plan import PlanResult, plan, plan_detailed
from scheduler.policy import DEFAULT_POLICY, Policy, QueueOrder
from scheduler.snapshot import (
    LIVE_RESERVATION_STATUSES,
    Gpu,
    GpuState,
    Id,
    Instant,
    Priority,
    QueuedJob,
    Reservation,
    ReservationStatus,
    Run,
    RunKind,
    Snapshot,
    TeamAccount,
    Usage,
)

__all__ = [
    "DEFAULT_POLICY",
    "LIVE_RESERVATION_STATUSES",
    "Action",
    "Gpu",
    "GpuState",
    "Id",
    "Instant",
    "Kill",
    "PastRun",
    "PlanResult",
    "Policy",
    "Priority",
    "QueueOrder",
    "QueuedJob",
    "Reason",
    "Release",
    "Reservation",
    "ReservationStatus",
    "Run",
    "RunKind",
    "Snapshot",
    "Start",
    "Stop",
    "TeamAccount",
    "Usage",
    "estimate_duration_s",
    "estimate_from_recent",
    "plan",
    "plan_detailed",
    "size_class",
]
