"""`plan(snapshot, now, policy) -> list[Action]`: one scheduling cycle, as a pure function.

The steps, each a policy module with its rule in its docstring:
1. release: no-show and early-finish releases (their GPUs are free for the rest of this plan);
2. slot_end (with reservations_first's clearing rule): Stop at deadline − grace, Kill at the
   deadline, for every run;
3. reservations_first: start the attached job of every reservation whose slot has begun;
4. backfill (with queue_order, fair_share, quota): start queued jobs on idle GPUs;
5. priority_preemption: an urgent/high job backfill could not start stops lower-priority
   backfill runs to make room;
6. queue_relief: if that stopped nothing and several jobs have waited long with no room,
   the checkpointable backfill run whose GPUs start the most of them is stopped;
7. queue_drain: if neither stopped anything and the oldest job that needs a whole node has
   waited long, the fewest runs on one node are stopped to empty it for that job, which
   backfill starts there first (step 4).

Output order is fixed: kills, stops (deadlines, then preemptions), releases, starts; within each, the order the step
visited them in (runs by id, reservations by start then id, jobs by queue order). The
plan depends only on the snapshot's contents, not on the order of its tuples.

Idempotence: a plan does not change the snapshot, so planning twice gives the same actions.
Once the applier has recorded a Stop (`stop_requested_at`), it is not sent again; a Start is
not repeated once its run appears in `runs` (the job is then "running").

`plan_detailed` also returns `next_wakeup`: the earliest future time at which this
snapshot's plan would change by the passage of time alone (a stop or kill due, a slot
starting or ending, a no-show threshold). reconcile schedules an ETA task for it; the
simulator uses it as a timer event.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from scheduler.actions import Action
from scheduler.backfill import start_queued_jobs
from scheduler.fair_share import FairShare, compute_fair_share
from scheduler.index import IndexCache, ReservationIndex, runs_view_of, topology_of
from scheduler.instants import check_now, converter_like, to_seconds
from scheduler.policy import DEFAULT_POLICY, Policy
from scheduler.priority_preemption import plan_priority_preemption
from scheduler.queue_drain import drain_target, plan_queue_drain
from scheduler.queue_relief import plan_queue_relief
from scheduler.quota import QuotaBook
from scheduler.release import plan_releases
from scheduler.reservations_first import start_reserved_runs
from scheduler.slot_end import plan_stops
from scheduler.snapshot import Id, Instant, Snapshot


@dataclass(frozen=True, slots=True)
class PlanResult:
    actions: tuple[Action, ...]
    next_wakeup: Instant | None


def plan(snapshot: Snapshot, now: Instant, policy: Policy = DEFAULT_POLICY) -> list[Action]:
    """The actions that bring the cluster in line with the policy at `now`."""
    return list(plan_detailed(snapshot, now, policy).actions)


def plan_detailed(
    snapshot: Snapshot,
    now: Instant,
    policy: Policy = DEFAULT_POLICY,
    *,
    cache: IndexCache | None = None,
) -> PlanResult:
    """`plan` with the next wake-up. `cache`: an `IndexCache` the caller owns, to reuse the
    indexes of unchanged tuples across plans (the simulator); it never changes the result."""
    check_now(now)
    now_s = to_seconds(now)
    to_instant = converter_like(now)
    if cache is None:
        topology = topology_of(snapshot.gpus)
        index = ReservationIndex.build(snapshot.reservations, now_s)
        runs_view = runs_view_of(snapshot.runs)
    else:
        topology = cache.topology(snapshot.gpus)
        index = cache.reservation_index(snapshot.reservations, now_s)
        runs_view = cache.runs_view(snapshot.runs)
    runs = runs_view.runs
    runs_by_reservation = runs_view.runs_by_reservation
    # The starts of this plan are added to these two.
    occupied = dict(runs_view.occupied)
    running_jobs = set(runs_view.running_jobs)

    wakeups: list[float] = []
    releases = plan_releases(index, runs_by_reservation, now_s, policy, wakeups)
    if releases:
        index = index.without_in_progress({release.reservation_id for release in releases})

    run_deadlines_s: dict[Id, float] = {}
    kills, stops = plan_stops(
        runs=runs,
        index=index,
        topology=topology,
        now_s=now_s,
        policy=policy,
        to_instant=to_instant,
        wakeups=wakeups,
        deadlines=run_deadlines_s,
    )
    reserved_starts = start_reserved_runs(
        index=index,
        runs_by_reservation=runs_by_reservation,
        occupied=occupied,
        running_jobs=running_jobs,
        topology=topology,
        now_s=now_s,
        policy=policy,
        to_instant=to_instant,
        wakeups=wakeups,
    )

    def fair_share(queued_users: Iterable[tuple[Id, Id]]) -> FairShare:
        return compute_fair_share(
            usage=snapshot.usage,
            runs=snapshot.runs,
            queued_users=queued_users,
            teams=snapshot.teams,
            now_s=now_s,
            policy=policy,
            total_gpus=topology.active_gpu_count,
        )

    quota = QuotaBook(
        teams=snapshot.teams,
        runs=runs,
        run_deadlines_s=run_deadlines_s,
        now_s=now_s,
        policy=policy,
    )
    target = drain_target(
        drains=snapshot.drains, queued_jobs=snapshot.queued_jobs, topology=topology,
        now_s=now_s, policy=policy,
    )
    backfill_starts = start_queued_jobs(
        queued_jobs=snapshot.queued_jobs,
        runs=runs,
        run_deadlines_s=run_deadlines_s,
        fair_share=fair_share,
        quota=quota,
        index=index,
        topology=topology,
        occupied=occupied,
        running_jobs=running_jobs,
        now_s=now_s,
        policy=policy,
        to_instant=to_instant,
        drain_target=target,
    )
    # The three steps that may stop runs for queued jobs see the same state: what this plan
    # has already started, stopped and killed.
    stopping_state = dict(
        queued_jobs=snapshot.queued_jobs,
        runs=runs,
        started_job_ids={start.job_id for start in (*reserved_starts, *backfill_starts)},
        running_jobs=running_jobs,
        stopping_run_ids={action.run_id for action in (*kills, *stops)},
        occupied=occupied,
        index=index,
        topology=topology,
        now_s=now_s,
        policy=policy,
        to_instant=to_instant,
        wakeups=wakeups,
    )
    preemption_stops = (
        plan_priority_preemption(**stopping_state)
        or plan_queue_relief(**stopping_state, history=snapshot.relief_history)
        or plan_queue_drain(
            **stopping_state, history=snapshot.relief_history, target=target,
            blocked_teams=quota.blocked_teams(),
        )
    )
    if preemption_stops:
        # Their kill is due a grace period from now if they have not left by then.
        wakeups.append(now_s + policy.grace_s)
    for start in (*reserved_starts, *backfill_starts):
        # The runs started now are not in the snapshot yet; their stop and kill are due
        # by time alone, so they count for the next wake-up too.
        if start.must_end_by is not None:
            must_end_s = to_seconds(start.must_end_by)
            wakeups.append(must_end_s - policy.grace_s)
            wakeups.append(must_end_s)
    # inf stands for "never" (a deadline that does not exist): not a wake-up.
    future = [moment for moment in wakeups if now_s < moment < math.inf]
    return PlanResult(
        actions=(
            *kills, *stops, *preemption_stops, *releases, *reserved_starts, *backfill_starts
        ),
        next_wakeup=to_instant(min(future)) if future else None,
    )
