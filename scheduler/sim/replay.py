"""Running one workload under one named policy: the cluster, the quotas, the fresh jobs.

Jobs larger than a node are placed on **whole nodes** (every policy); only jobs larger than
the whole cluster are reported as unplaceable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from scheduler.policy import Policy
from scheduler.sim.engine import SimJob, Simulation, SimulationConfig, SimulationResult
from scheduler.sim.policies import (
    EXACT_RUNTIME_POLICIES,
    RUN_AWARE_BOOKING_POLICIES,
    policy_for,
)
from scheduler.sim.workload import Workload, make_gpus
from scheduler.snapshot import Gpu

# Quotas are sized to each team's demand divided by this load, i.e. generous: the trace
# has no quotas, so the replay only checks that none is overspent.
QUOTA_HEADROOM = 1.25


@dataclass(frozen=True, slots=True)
class Scenario:
    trace: str
    jobs: int
    gpus: int
    gpus_per_node: int
    window_start_s: float
    window_end_s: float
    offered_gpus: float
    offered_load: float
    reservation_share: float
    bookings: int
    booked_gpu_hours: float
    bookings_shifted: int
    bookings_refused: int
    slot_minutes: float
    restart_overhead_s: float
    grace_s: float
    seed: int
    large_jobs: str
    checkpointable_share: float
    quota: str


def fresh_jobs(
    workload: Workload, *, without_bookings: bool, exact_estimates: bool = False
) -> list[SimJob]:
    jobs = [replace(job) for job in workload.jobs]
    if without_bookings:
        jobs = [replace(job, booking_id=None) for job in jobs]
    if exact_estimates:
        jobs = [replace(job, estimate_s=job.duration_s) for job in jobs]
    return jobs


def team_quotas(workload: Workload, policy: Policy, load: float) -> dict[str, float]:
    demand: dict[str, float] = {}
    booked = {booking.job_id for booking in workload.bookings}
    for job in workload.jobs:
        factor = 1.0 if job.id in booked else policy.usage_factor
        demand[job.team] = demand.get(job.team, 0.0) + job.gpus * job.duration_s * factor
    return {
        team: QUOTA_HEADROOM * gpu_s / max(min(load, 1.0), 0.1)
        for team, gpu_s in sorted(demand.items())
    }


def run_policy(
    name: str,
    workload: Workload,
    *,
    gpus_total: int,
    gpus_per_node: int,
    restart_overhead_s: float,
    load: float,
    grace_s: float,
    policy: Policy | None = None,
    run_aware_booking: bool | None = None,
    gpus: tuple[Gpu, ...] | None = None,
) -> tuple[SimulationResult, float]:
    """Replay `workload` under the named policy (or `policy`, a variant of it).
    `run_aware_booking` (default: gpubook only) places bookings when they are made, around
    the runs then (`SimulationConfig.run_aware_booking`). `gpus`: a real cluster's GPUs
    (nodes of any size) instead of `gpus_total` on nodes of `gpus_per_node`."""
    if run_aware_booking is None:
        run_aware_booking = name in RUN_AWARE_BOOKING_POLICIES
    policy = policy or policy_for(name, grace_s=grace_s)
    fifo = name == "fifo"
    exact = name in EXACT_RUNTIME_POLICIES
    config = SimulationConfig(
        gpus=gpus or make_gpus(gpus_total, gpus_per_node),
        policy=policy,
        restart_overhead_s=restart_overhead_s,
        team_quota_gpu_s=team_quotas(workload, policy, load),
        use_estimator=policy.use_estimates and not exact,
        run_aware_booking=run_aware_booking,
    )
    simulation = Simulation(
        config,
        fresh_jobs(workload, without_bookings=fifo, exact_estimates=exact),
        () if fifo else workload.bookings,
    )
    started = time.perf_counter()
    result = simulation.run()
    return result, time.perf_counter() - started
