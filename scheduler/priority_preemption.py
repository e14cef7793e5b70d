"""Policy: priority preemption — an urgent or high job that cannot start may stop running
backfill runs of lower priority to make room.

Rule (after backfill has placed what it could, when `Policy.priority_preemption` is on):
1. **Who may preempt**: queued jobs of class urgent or high that backfill did not start, in
   queue order (class, then submit time, then id). An urgent job beyond its team's
   `urgent_limit_per_team` counts as high. Jobs larger than a node do not preempt.
2. **Who may be preempted**: backfill runs only — never a reserved run, never a run inside
   its own booking (`reservation_id` set) — of a strictly lower class than the preemptor,
   that have run at least `min_runtime_before_preemption_s`, and whose stop has not been
   requested yet.
3. **Where**: on one node, the GPUs the job would get are idle ones, ones whose stop is
   already requested (they free within a grace period), and the victims'. The job must fit
   there before the next reservation on those GPUs (its estimate, scaled by
   `non_checkpointable_gap_factor` if it cannot checkpoint, plus grace). Among the nodes
   that can host it, the one that loses least: fewest non-checkpointable victims, then
   least work lost (their GPU-seconds since start), then fewest GPUs stopped, then node id.
4. **How many**: never more than needed: victims are taken checkpointable first, then the
   least work lost, then run id, until the job fits; a victim whose GPUs are not needed
   after all (a later, larger victim covered them) is dropped again.
   If a run is too young to preempt, plan wakes up when it no longer is.
5. Each victim gets `Stop(reason=PRIORITY_PREEMPTION, grace)`; the job starts on a later
   plan once the GPUs are free (it ranks first among what is queued). The GPUs a job
   claimed here (idle, stopping, stopped) are not counted again for the next job, and a
   job that a stop already requested covers asks for no new stop, so plans in a row do not
   stop more runs for the same job.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler.actions import Reason, Stop
from scheduler.index import ReservationIndex, Topology
from scheduler.instants import INFINITY, to_seconds
from scheduler.policy import Policy
from scheduler.queue_order import CLASS_RANK, HIGH_RANK, PRIORITY_OF
from scheduler.snapshot import Id, Instant, Priority, QueuedJob, Run, RunKind

PREEMPTING_CLASSES = frozenset({Priority.URGENT, Priority.HIGH})


def _effective_ranks(
    queued_jobs: tuple[QueuedJob, ...], runs: list[Run], policy: Policy
) -> dict[Id, int]:
    """Class rank of each urgent or high queued job, urgent past the team limit as high
    (the same rule as queue_order: the team's urgent runs count first, then its queued
    urgent jobs by submit time)."""
    if PREEMPTING_CLASSES.isdisjoint(map(PRIORITY_OF, queued_jobs)):
        return {}  # the common case, told by a pass in C instead of one in Python
    urgent_in_use: dict[Id, int] = {}
    for run in runs:
        if run.priority == Priority.URGENT:
            urgent_in_use[run.team] = urgent_in_use.get(run.team, 0) + 1
    ranks: dict[Id, int] = {}
    for job in sorted(
        (job for job in queued_jobs if job.priority in PREEMPTING_CLASSES),
        key=lambda job: (to_seconds(job.submitted_at), job.id),
    ):
        rank = CLASS_RANK[job.priority]
        if job.priority == Priority.URGENT:
            used = urgent_in_use.get(job.team, 0)
            if used >= policy.urgent_limit_per_team:
                rank = HIGH_RANK
            else:
                urgent_in_use[job.team] = used + 1
        ranks[job.id] = rank
    return ranks


def plan_priority_preemption(
    *,
    queued_jobs: tuple[QueuedJob, ...],
    runs: list[Run],
    started_job_ids: set[Id],
    running_jobs: set[Id],
    stopping_run_ids: set[Id],
    occupied: dict[Id, Id],
    index: ReservationIndex,
    topology: Topology,
    now_s: float,
    policy: Policy,
    to_instant: Callable[[float], Instant],
    wakeups: list[float],
) -> list[Stop]:
    if not policy.priority_preemption or not queued_jobs:
        return []
    ranks = _effective_ranks(queued_jobs, runs, policy)
    if not ranks:
        return []
    contenders = sorted(
        (
            job for job in queued_jobs
            if job.id in ranks
            and job.id not in started_job_ids
            and job.id not in running_jobs
            and 0 < job.gpus_needed <= topology.max_node_size
        ),
        key=lambda job: (ranks[job.id], to_seconds(job.submitted_at), job.id),
    )
    if not contenders:
        return []
    # Bounded work per plan (as backfill's max_jobs_examined): the best-ranked few only.
    contenders = contenders[: policy.max_preempting_jobs_per_plan]

    gpu_by_id = topology.gpu_by_id
    runs_on_node: dict[Id, list[Run]] = {}
    stopping_gpus: set[Id] = set()
    for run in runs:
        if run.stop_requested_at is not None or run.id in stopping_run_ids:
            stopping_gpus.update(run.gpu_ids)
            continue
        nodes = {gpu_by_id[gpu_id].node for gpu_id in run.gpu_ids if gpu_id in gpu_by_id}
        if len(nodes) == 1:
            runs_on_node.setdefault(nodes.pop(), []).append(run)
    strongest = ranks[contenders[0].id]
    if not any(
        CLASS_RANK[run.priority] > strongest
        for node_runs in runs_on_node.values() for run in node_runs
        if run.kind == RunKind.BACKFILL and run.reservation_id is None
    ):
        return []  # nobody of a lower class runs: nothing to preempt (the common case)
    held = set(occupied) | set(index.in_progress_on_gpu)
    active = topology.active_gpu_ids
    claimed: set[Id] = set()
    victims_taken: set[Id] = set()
    stops: list[Stop] = []
    min_runtime_s = policy.min_runtime_before_preemption_s
    grace_s = policy.grace_s
    next_start = index.next_start_on_gpu

    # Per node, once: the GPUs that are or will soon be free ((next reservation, id)) and
    # the runs that may be stopped at all, cheapest loss first.
    def soon_free(gpu_id: Id) -> bool:
        slot = index.in_progress_on_gpu.get(gpu_id)
        return gpu_id in active and (slot is None or slot.end_s <= now_s + grace_s)

    free_on_node: dict[Id, list[tuple[float, Id]]] = {}
    victims_on_node: dict[Id, list[tuple[tuple, Run]]] = {}
    # At most this many GPUs could ever be had on the node (free now or soon, or a victim's).
    capacity_on_node: dict[Id, int] = {}
    for node, gpus in topology.node_gpus.items():
        free_on_node[node] = [
            (next_start.get(gpu.id, INFINITY), gpu.id) for gpu in gpus
            if soon_free(gpu.id) and (gpu.id not in held or gpu.id in stopping_gpus)
        ]
        victims = []
        for run in runs_on_node.get(node, ()):
            ran_s = now_s - to_seconds(run.started_at)
            if (
                run.kind == RunKind.BACKFILL
                and run.reservation_id is None
                and ran_s >= min_runtime_s
                and all(soon_free(gpu_id) for gpu_id in run.gpu_ids)
            ):
                loss = len(run.gpu_ids) * ran_s
                victims.append(((not run.checkpointable, loss, run.id), run))
        victims.sort(key=lambda entry: entry[0])
        if victims or free_on_node[node]:
            victims_on_node[node] = victims
            capacity_on_node[node] = len(free_on_node[node]) + sum(
                len(run.gpu_ids) for _, run in victims
            )
    if not any(victims_on_node.values()):
        return []
    # (rank, GPUs needed, needed-until) of jobs that found no room: a job no better placed
    # (same class or lower, as many GPUs or more, needing the GPUs as long or longer) will
    # not find any either, since claims only grow.
    failed: list[tuple[int, int, float]] = []

    for job in contenders:
        rank = ranks[job.id]
        needed = job.gpus_needed
        estimate_s = job.estimated_duration_s or policy.default_estimate_s
        if not job.checkpointable:
            estimate_s *= policy.non_checkpointable_gap_factor
        # The job starts once the stopped runs are gone, a grace period from now.
        needed_until_s = now_s + grace_s + estimate_s + grace_s
        if any(
            rank >= fail_rank and needed >= fail_needed and needed_until_s >= fail_until
            for fail_rank, fail_needed, fail_until in failed
        ):
            best = None
        else:
            best = _best_node(
                needed=needed, rank=rank, needed_until_s=needed_until_s,
                nodes={
                    node: free_on_node[node] for node, capacity in capacity_on_node.items()
                    if capacity >= needed
                },
                victims_on_node=victims_on_node, claimed=claimed, victims_taken=victims_taken,
                next_start=next_start,
            )
        if best is None:
            failed.append((rank, needed, needed_until_s))
            # A run that is only too young to preempt becomes a victim by time alone.
            for node_runs in runs_on_node.values():
                for run in node_runs:
                    eligible_s = to_seconds(run.started_at) + min_runtime_s
                    if (
                        eligible_s > now_s
                        and run.kind == RunKind.BACKFILL
                        and run.reservation_id is None
                        and CLASS_RANK[run.priority] > rank
                    ):
                        wakeups.append(eligible_s)
            continue
        _, gpu_ids, chosen = best
        claimed.update(gpu_ids)
        for run in chosen:
            claimed.update(run.gpu_ids)
            victims_taken.add(run.id)
            stops.append(
                Stop(
                    run_id=run.id,
                    reason=Reason.PRIORITY_PREEMPTION,
                    grace_s=grace_s,
                    kill_at=to_instant(now_s + grace_s),
                    for_job_id=job.id,
                )
            )
    stops.sort(key=lambda stop: stop.run_id)
    return stops


def _best_node(
    *,
    needed: int,
    rank: int,
    needed_until_s: float,
    nodes: dict[Id, list[tuple[float, Id]]],
    victims_on_node: dict[Id, list[tuple[tuple, Run]]],
    claimed: set[Id],
    victims_taken: set[Id],
    next_start: dict[Id, float],
) -> tuple[tuple, list[Id], list[Run]] | None:
    """The node that makes room for the job at least loss, its GPUs and its victims."""
    best: tuple[tuple, list[Id], list[Run]] | None = None
    for node, free_gpus in nodes.items():
        free = [
            gpu_id for horizon_s, gpu_id in free_gpus
            if horizon_s >= needed_until_s and gpu_id not in claimed
        ]
        if len(free) >= needed:
            # Room without stopping anything (a stop already requested covers it).
            return ((-1, 0.0, 0, node), free[:needed], [])
        victims = victims_on_node[node]
        if not victims:
            continue
        chosen: list[Run] = []
        have = len(free)
        for _, run in victims:
            if have >= needed:
                break
            if (
                run.id in victims_taken
                or CLASS_RANK[run.priority] <= rank
                or any(
                    gpu_id in claimed or next_start.get(gpu_id, INFINITY) < needed_until_s
                    for gpu_id in run.gpu_ids
                )
            ):
                continue
            chosen.append(run)
            have += len(run.gpu_ids)
        if have < needed:
            continue
        # Never more than needed: drop victims (last taken first) the rest covers.
        for run in list(reversed(chosen)):
            if have - len(run.gpu_ids) >= needed:
                chosen.remove(run)
                have -= len(run.gpu_ids)
        losses = {run.id: key for key, run in victims}
        key = (
            sum(1 for run in chosen if not run.checkpointable),
            sum(losses[run.id][1] for run in chosen if not run.checkpointable),
            sum(len(run.gpu_ids) for run in chosen),
            node,
        )
        if best is None or key < best[0]:
            gpu_ids = free + [gpu_id for run in chosen for gpu_id in run.gpu_ids]
            best = (key, gpu_ids[:needed], chosen)
    return best
