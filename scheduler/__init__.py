"""gpubook's scheduling core: pure functions over frozen snapshots, no Django, no clock.

`plan(snapshot, now, policy)` is the entry point (`estimate_starts` rolls it forward for
the queue's estimated starts); see `scheduler.snapshot` for what a
snapshot holds, `scheduler.actions` for what comes back, `scheduler.policy` for the knobs,
and `scheduler.sim` for the trace-replay simulator (which the core never imports).
"""

from scheduler.actions import Action, Kill, Reason, Release, Start, Stop
from scheduler.estimate import (
    PastRun,
    RuntimeEstimate,
    RuntimeSource,
    estimate_duration_s,
    estimate_from_recent,
    predict_runtime,
    size_class,
)
from scheduler.plan import PlanResult, plan, plan_detailed
from scheduler.policy import DEFAULT_POLICY, Policy, QueueOrder
from scheduler.queue_estimates import QueueEstimate, WaitReason, estimate_starts
from scheduler.queue_relief import BUDGETED_REASONS
from scheduler.snapshot import (
    LIVE_RESERVATION_STATUSES,
    Drain,
    Gpu,
    GpuState,
    Id,
    Instant,
    Priority,
    QueuedJob,
    ReliefHistory,
    Reservation,
    ReservationStatus,
    Run,
    RunKind,
    Snapshot,
    TeamAccount,
    Usage,
)

__all__ = [
    "BUDGETED_REASONS",
    "DEFAULT_POLICY",
    "LIVE_RESERVATION_STATUSES",
    "Action",
    "Drain",
    "Gpu",
    "GpuState",
    "Id",
    "Instant",
    "Kill",
    "PastRun",
    "PlanResult",
    "Policy",
    "Priority",
    "QueueEstimate",
    "QueueOrder",
    "QueuedJob",
    "Reason",
    "Release",
    "ReliefHistory",
    "Reservation",
    "ReservationStatus",
    "Run",
    "RunKind",
    "RuntimeEstimate",
    "RuntimeSource",
    "Snapshot",
    "Start",
    "Stop",
    "TeamAccount",
    "Usage",
    "WaitReason",
    "estimate_duration_s",
    "estimate_from_recent",
    "estimate_starts",
    "plan",
    "plan_detailed",
    "predict_runtime",
    "size_class",
]
