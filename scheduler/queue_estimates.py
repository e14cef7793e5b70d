"""Queue estimates: for every queued job, its position, an estimated start and why it waits
(issue #18 item 2), like Slurm's `squeue --start`.

Rule: `estimate_starts(snapshot, now, policy)` rolls the scheduler's own `plan()` forward
from `now` over what is known: the live reservations (their attached jobs start at their
slots and end at the slot's end), the running jobs (each ends at its `estimated_end`, or
`Policy.default_estimate_s` from now when it has none or has outlived it, never after its
`must_end_by`), and the queued jobs (each runs for its estimate, or the default, once
started). Between plans the clock jumps to the next moment the picture changes: a run's
predicted end, a reservation's end, or the plan's own `next_wakeup`. A job's estimated start
is the first plan that starts it. The roll-forward stops past `horizon_s`, after `max_plans`
plans, or once its `budget` is spent: plans counted by the queued jobs each one orders (the
part of plan() that grows with the queue), so a lab-sized queue gets hundreds of plans and a
5,000-job queue about a hundred, at about the same cost. A job not started by then gets no
estimate but a bound that is true of the rolled-forward cluster, `not_before`: the time the
roll-forward had reached (nothing could start it earlier). A job that nothing will ever
start (no run or booking left to end, no timer) gets neither.

The budget is not in seconds, so the answer is deterministic. One plan per moment the picture
changes is exact but costs a plan per run end — at 1,024 GPUs about one per 20 s of cluster
time, and thousands to reach the end of a 5,000-job queue (~1 min). So once half the budget is
spent the steps turn coarse, as Slurm's backfill works at a time resolution: each plan also
takes in every run and booking ending until the distance from now has grown by
`COARSE_GROWTH` (10 %: an estimate a day ahead is coarser than one an hour ahead, as its
inputs are), a job it starts is dated to when its GPUs free, and it may make as many
priority-preemption waves (`max_preempting_jobs_per_plan` each) as the grace periods the step
stands for — without that, coarse steps starve high-priority jobs by hours (BENCHMARKS.md).
A lab-sized queue is resolved exactly to its end long before half the budget.

Queue relief and queue drain act in the roll-forward as on the cluster: each plan sees the
snapshot's relief history and drains with the stops and drains made so far in the
roll-forward, so a whole-node job is dated to the node drained for it, and relief's budget is
spent once, not afresh at each plan. A run they stop ends after its grace; its job, queued
again to resume, is not rolled forward (the estimate is optimistic by that much for those
behind it, as for priority preemption).

Jobs submitted later are unknown, so the estimate is what would happen if nobody else
submitted — optimistic for low ranks under fair share, as Slurm's is.

Position: 1-based rank in the order backfill would try the jobs now (`queue_order`).
Why it waits, from the picture at `now`: it starts now; its team's quota is spent; it is
larger than any node (or the cluster); a node is being drained for it (queue drain, while
the node is kept for it); idle GPUs would fit it but a booking starts on them before it could
finish (that booking is named); or it waits for running jobs to free GPUs (first in line) or
behind jobs ranked ahead of it.

Pure and deterministic: the snapshot is not changed; every sort has a tie-break.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum

from scheduler.actions import Kill, Reason, Release, Start, Stop
from scheduler.fair_share import FairShare, compute_fair_share
from scheduler.index import IndexCache, ReservationIndex, topology_of
from scheduler.instants import INFINITY, converter_like, optional_seconds, to_seconds
from scheduler.plan import plan_detailed
from scheduler.policy import DAY_S, DEFAULT_POLICY, Policy
from scheduler.queue_drain import drain_target
from scheduler.queue_order import CANDIDATE, order_queue
from scheduler.queue_relief import BUDGETED_REASONS
from scheduler.quota import QuotaBook
from scheduler.snapshot import Drain, Id, Instant, Priority, QueuedJob, Run, RunKind, Snapshot

# The budget of one estimate in job-plans (each plan counts the queued jobs it orders): about
# 2 s of CPU at 1,024 GPUs and 5,000 queued (BENCHMARKS.md); a lab-sized queue reaches its end
# or `max_plans` first.
PLAN_BUDGET = 500_000
# Once this share of the budget is spent, steps turn coarse: each takes in what happens until
# the distance from now has grown by this factor (module docstring).
EXACT_SHARE = 0.5
COARSE_GROWTH = 1.1


class WaitReason(StrEnum):
    STARTS_NOW = "starts_now"
    QUOTA = "quota"
    TOO_LARGE = "too_large"
    BOOKING_AHEAD = "booking_ahead"
    GPUS_BUSY = "gpus_busy"
    QUEUE_AHEAD = "queue_ahead"
    NODE_DRAINING = "node_draining"

    @property
    def sentence(self) -> str:
        return _SENTENCES[self]


_SENTENCES = {
    WaitReason.STARTS_NOW: "Starts at the next scheduler tick.",
    WaitReason.QUOTA: "The team's quota for the month is used up.",
    WaitReason.TOO_LARGE: "Needs more GPUs than any node (or the cluster) has.",
    WaitReason.BOOKING_AHEAD: "Idle GPUs would fit it, but a booking starts on them before "
    "it could finish.",
    WaitReason.GPUS_BUSY: "First in line; waits for running jobs to free enough GPUs.",
    WaitReason.QUEUE_AHEAD: "Jobs ranked ahead of it get the next free GPUs.",
    WaitReason.NODE_DRAINING: "A node is being emptied for it: the runs there save a checkpoint, "
    "and it starts there once they have left.",
}


@dataclass(frozen=True, slots=True)
class QueueEstimate:
    job_id: Id
    position: int
    estimated_start: Instant | None
    wait_reason: WaitReason
    # The booking whose start keeps the idle GPUs from it (BOOKING_AHEAD only).
    blocking_reservation_id: Id | None = None
    # No start found, but the roll-forward stopped (plan budget or horizon) before it could
    # tell: the job starts no earlier than this. None with no start: it never starts.
    not_before: Instant | None = None


def _predicted_end_s(run: Run, now_s: float, policy: Policy) -> float:
    end_s = optional_seconds(run.estimated_end)
    if end_s == INFINITY or end_s <= now_s:
        end_s = now_s + policy.default_estimate_s
    if run.stop_requested_at is not None:
        end_s = min(end_s, to_seconds(run.stop_requested_at) + policy.grace_s)
    return min(end_s, optional_seconds(run.must_end_by))


def queue_positions(snapshot: Snapshot, now_s: float, policy: Policy) -> dict[Id, int]:
    """1-based rank of every queued job (not running) in backfill's order at `now_s`."""
    running = {run.job_id for run in snapshot.runs}
    runs = sorted(snapshot.runs, key=lambda run: run.id)
    total_gpus = topology_of(snapshot.gpus).active_gpu_count

    def fair_share(queued_users: Iterable[tuple[Id, Id]]) -> FairShare:
        return compute_fair_share(
            usage=snapshot.usage, runs=snapshot.runs, queued_users=queued_users,
            teams=snapshot.teams, now_s=now_s, policy=policy, total_gpus=total_gpus,
        )

    quota = QuotaBook(
        teams=snapshot.teams, runs=runs, run_deadlines_s={}, now_s=now_s, policy=policy
    )
    ordered, _ = order_queue(
        queued_jobs=snapshot.queued_jobs,
        runs=runs,
        fair_share=fair_share,
        quota=quota,
        classify=lambda job: None if job.id in running else CANDIDATE,
        now_s=now_s,
        policy=policy,
    )
    return {job.id: position for position, (_, job) in enumerate(ordered, start=1)}


def estimate_starts(
    snapshot: Snapshot,
    now: Instant,
    policy: Policy = DEFAULT_POLICY,
    *,
    horizon_s: float = 14 * DAY_S,
    max_plans: int = 500,
    budget: int = PLAN_BUDGET,
    until_started: Id | None = None,
) -> dict[Id, QueueEstimate]:
    """`until_started`: stop rolling forward once that job has started (the submit form's
    preview needs one job's start; later plans cannot change it). Other jobs' estimates are
    then only those found by that time, and the rest get that time as their `not_before`."""
    now_s = to_seconds(now)
    to_instant = converter_like(now)
    positions = queue_positions(snapshot, now_s, policy)
    waiting = {job.id: job for job in snapshot.queued_jobs if job.id in positions}
    reasons = _wait_reasons(snapshot, now_s, policy, waiting, positions)

    # The rolled-forward state: runs with their predicted ends, queued jobs, reservations.
    runs: dict[Id, Run] = {run.id: run for run in snapshot.runs}
    ends: dict[Id, float] = {run.id: _predicted_end_s(run, now_s, policy) for run in runs.values()}
    queued: dict[Id, QueuedJob] = dict(waiting)
    reservations = {item.id: item for item in snapshot.reservations}
    reservation_ends = {item.id: to_seconds(item.end) for item in snapshot.reservations}
    started_at: dict[Id, float] = {}
    # Queue relief and queue drain act on the roll-forward as they would on the cluster: their
    # budget counts the stops made in it, and a drain keeps its node for its job.
    relief_stops = list(snapshot.relief_history.stops)
    drains = list(snapshot.drains)
    cache = IndexCache()
    next_run_id = 0
    # Runs started by the estimate need ids that sort with the snapshot's own.
    if all(isinstance(run_id, int) for run_id in runs):
        base = max(runs, default=0)

        def new_run_id(number: int) -> Id:
            return base + number
    else:

        def new_run_id(number: int) -> Id:
            return f"~estimate-{number:09d}"
    t: float | None = now_s
    reservations_tuple = tuple(reservations.values())
    horizon_end_s = now_s + horizon_s
    spent = 0
    # A coarse step takes in every run and booking ending up to `step_end_s` (its GPUs were
    # free since `free_since`); an exact step ends where it starts.
    step_end_s = now_s
    free_since: dict[Id, float] = {}
    preempting = policy.max_preempting_jobs_per_plan
    for _ in range(max_plans):
        if not queued or t > horizon_end_s or spent >= budget:
            break
        state = Snapshot(
            gpus=snapshot.gpus, reservations=reservations_tuple,
            queued_jobs=tuple(queued.values()), runs=tuple(runs.values()),
            usage=snapshot.usage, teams=snapshot.teams,
            relief_history=replace(snapshot.relief_history, stops=tuple(relief_stops)),
            drains=tuple(drains),
        )
        # A coarse step stands for one plan per grace period: as many preemption waves.
        waves = int((step_end_s - t) // policy.grace_s)
        step_policy = policy if waves <= 1 else replace(
            policy, max_preempting_jobs_per_plan=preempting * waves
        )
        result = plan_detailed(state, to_instant(t), step_policy, cache=cache)
        spent += len(state.queued_jobs)
        for action in result.actions:
            if isinstance(action, Start):
                next_run_id += 1
                run_id = new_run_id(next_run_id)
                job = queued.pop(action.job_id, None)
                if action.kind == RunKind.BACKFILL and job is not None:
                    # Once its GPUs are free: after a coarse step, maybe later than `t`.
                    start_s = max(t, *(free_since.get(gpu_id, t) for gpu_id in action.gpu_ids))
                    started_at.setdefault(job.id, start_s)
                    estimate_s = job.estimated_duration_s or policy.default_estimate_s
                    team, user, priority = job.team, job.user, job.priority
                    estimated_end = to_instant(start_s + estimate_s)
                else:
                    start_s = t
                    estimated_end = action.estimated_end
                    estimate_s = INFINITY  # a reserved run holds its slot to the end
                    slot = reservations.get(action.reservation_id)
                    team = slot.team if slot else ""
                    user = slot.user if slot else ""
                    priority = job.priority if job else Priority.MEDIUM
                    if job is not None:
                        started_at.setdefault(job.id, t)
                run = Run(
                    id=run_id, job_id=action.job_id, gpu_ids=action.gpu_ids, kind=action.kind,
                    started_at=to_instant(start_s), team=team, user=user,
                    reservation_id=action.reservation_id, must_end_by=action.must_end_by,
                    estimated_end=estimated_end, priority=priority,
                )
                runs[run_id] = run
                ends[run_id] = min(start_s + estimate_s, optional_seconds(action.must_end_by))
            elif isinstance(action, Stop):
                if action.reason in BUDGETED_REASONS:
                    relief_stops.append(to_instant(t))
                if action.reason == Reason.QUEUE_DRAIN:
                    drains.append(Drain(
                        at=to_instant(t), job_id=action.for_job_id,
                        gpu_ids=runs[action.run_id].gpu_ids,
                    ))
                runs[action.run_id] = replace(runs[action.run_id], stop_requested_at=to_instant(t))
                ends[action.run_id] = min(ends[action.run_id], t + action.grace_s)
            elif isinstance(action, Kill):
                runs.pop(action.run_id, None)
                ends.pop(action.run_id, None)
            elif isinstance(action, Release):
                reservations.pop(action.reservation_id, None)
                reservation_ends.pop(action.reservation_id, None)
                reservations_tuple = tuple(reservations.values())
        if not queued or until_started in started_at:
            break
        # The next moment the picture changes: a run's predicted end, a booking's end, or
        # a time this plan itself names (a stop or kill due, a slot starting, a no-show).
        upcoming = min(
            (moment for moment in (*ends.values(), *reservation_ends.values()) if moment > t),
            default=INFINITY,
        )
        if result.next_wakeup is not None:
            upcoming = min(upcoming, to_seconds(result.next_wakeup))
        if upcoming == INFINITY:
            t = None  # nothing will ever change: the jobs still queued never start
            break
        # Nothing inside a coarse step already taken in is planned on its own.
        t = step_end_s = max(upcoming, step_end_s)
        if spent >= budget * EXACT_SHARE:
            step_end_s = max(t, now_s + COARSE_GROWTH * max(t - now_s, policy.grace_s))
        for run_id in sorted((run_id for run_id, end_s in ends.items() if end_s <= step_end_s), key=str):
            for gpu_id in runs[run_id].gpu_ids:
                free_since[gpu_id] = ends[run_id]
            del ends[run_id]
            del runs[run_id]
        gone = [reservation_id for reservation_id, end_s in reservation_ends.items() if end_s <= step_end_s]
        if gone:
            for reservation_id in gone:
                for gpu_id in reservations[reservation_id].gpu_ids:
                    free_since[gpu_id] = max(free_since.get(gpu_id, t), reservation_ends[reservation_id])
                del reservations[reservation_id]
                del reservation_ends[reservation_id]
            reservations_tuple = tuple(reservations.values())

    # Jobs not started by the time the roll-forward stopped start later than that, if ever.
    not_before = None if t is None else to_instant(t)
    estimates = {}
    for job_id, position in positions.items():
        reason, blocking = reasons[job_id]
        start_s = started_at.get(job_id)
        if start_s is not None and start_s <= now_s:
            reason, blocking = WaitReason.STARTS_NOW, None
        estimates[job_id] = QueueEstimate(
            job_id=job_id,
            position=position,
            estimated_start=None if start_s is None else to_instant(start_s),
            wait_reason=reason,
            blocking_reservation_id=blocking,
            not_before=not_before if start_s is None else None,
        )
    return estimates


def _wait_reasons(
    snapshot: Snapshot,
    now_s: float,
    policy: Policy,
    waiting: dict[Id, QueuedJob],
    positions: dict[Id, int],
) -> dict[Id, tuple[WaitReason, Id | None]]:
    topology = topology_of(snapshot.gpus)
    index = ReservationIndex.build(snapshot.reservations, now_s)
    held = {gpu_id for run in snapshot.runs for gpu_id in run.gpu_ids}
    held.update(index.in_progress_on_gpu)
    idle_by_node: dict[Id, list[tuple[float, Id]]] = {}
    for node, gpus in topology.node_gpus.items():
        idle_by_node[node] = sorted(
            (index.next_start_on_gpu.get(gpu.id, INFINITY), gpu.id)
            for gpu in gpus
            if gpu.id in topology.active_gpu_ids and gpu.id not in held
        )
    next_reservation_on_gpu: dict[Id, tuple[float, Id]] = {}
    for item in index.by_id.values():
        if item.start_s > now_s:
            for gpu_id in item.reservation.gpu_ids:
                current = next_reservation_on_gpu.get(gpu_id)
                if current is None or (item.start_s, item.reservation.id) < current:
                    next_reservation_on_gpu[gpu_id] = (item.start_s, item.reservation.id)
    blocked_teams = {
        team.team for team in snapshot.teams
        if team.quota_remaining_gpu_s is not None
        and team.quota_remaining_gpu_s <= 0
        and not team.over_quota_allowed
    }
    target = drain_target(
        drains=snapshot.drains, queued_jobs=waiting.values(), topology=topology, now_s=now_s,
        policy=policy,
    )
    draining = target.job.id if target is not None and target.held_nodes else None
    first_waiting = True
    reasons: dict[Id, tuple[WaitReason, Id | None]] = {}
    for job in sorted(waiting.values(), key=lambda job: positions[job.id]):
        needed = job.gpus_needed
        if job.team in blocked_teams:
            reasons[job.id] = (WaitReason.QUOTA, None)
            continue
        if needed > topology.active_gpu_count or (
            needed > topology.max_node_size and not policy.allow_multi_node
        ):
            reasons[job.id] = (WaitReason.TOO_LARGE, None)
            continue
        if job.id == draining:
            reasons[job.id] = (WaitReason.NODE_DRAINING, None)
            first_waiting = False
            continue
        blocking = None
        for node in sorted(idle_by_node):
            idle = idle_by_node[node]
            if len(idle) >= needed:
                # The needed GPUs with the latest next reservation; the earliest of those
                # is what cuts the gap short.
                chosen = idle[-needed:]
                earliest = min(chosen)
                if earliest[0] < INFINITY:
                    blocking = next_reservation_on_gpu.get(earliest[1], (INFINITY, None))[1]
                break
        if blocking is not None:
            reasons[job.id] = (WaitReason.BOOKING_AHEAD, blocking)
        elif first_waiting:
            reasons[job.id] = (WaitReason.GPUS_BUSY, None)
        else:
            reasons[job.id] = (WaitReason.QUEUE_AHEAD, None)
        first_waiting = False
    return reasons
