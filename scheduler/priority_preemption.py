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
from scheduler.queue_order import CLASS_RANK, HIGH_RANK
from scheduler.snapshot import Id, Instant, Priority, QueuedJob, Run, RunKind

PREEMPTING_CLASSES = frozenset({Priority.URGENT, Priority.HIGH})


def _effective_ranks(
    queued_jobs: tuple[QueuedJob, ...], runs: list[Run], policy: Policy
) -> dict[Id, int]:
    """Class rank of each urgent or high queued job, urgent past the team limit as high
    (the same rule as queue_order: the team's urgent runs count first, then its queued
    urgent jobs by submit time)."""
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
    held = set(occupied) | set(index.in_progress_on_gpu)
    active = topology.active_gpu_ids
    claimed: set[Id] = set()
    victims_taken: set[Id] = set()
    stops: list[Stop] = []
    min_runtime_s = policy.min_runtime_before_preemption_s
    grace_s = policy.grace_s

    for job in contenders:
        rank = ranks[job.id]
        estimate_s = job.estimated_duration_s or policy.default_estimate_s
        if not job.checkpointable:
            estimate_s *= policy.non_checkpointable_gap_factor
        # The job starts once the stopped runs are gone, a grace period from now.
        needed_until_s = now_s + grace_s + estimate_s + grace_s

        def usable(gpu_id: Id, needed_until_s: float = needed_until_s) -> bool:
            slot = index.in_progress_on_gpu.get(gpu_id)
            return (
                gpu_id in active
                and gpu_id not in claimed
                and (slot is None or slot.end_s <= now_s + grace_s)
                and index.next_start_on_gpu.get(gpu_id, INFINITY) >= needed_until_s
            )

        best: tuple[tuple, list[Id], list[Run]] | None = None
        for node, gpus in topology.node_gpus.items():
            free = [
                gpu.id for gpu in gpus
                if usable(gpu.id) and (gpu.id not in held or gpu.id in stopping_gpus)
            ]
            if len(free) >= job.gpus_needed:
                # Room without stopping anything (a stop already requested covers it).
                best = ((-1, 0.0, 0, node), free[: job.gpus_needed], [])
                break
            candidates = [
                run for run in runs_on_node.get(node, ())
                if run.kind == RunKind.BACKFILL
                and run.reservation_id is None
                and run.id not in victims_taken
                and CLASS_RANK[run.priority] > rank
                and now_s - to_seconds(run.started_at) >= min_runtime_s
                and all(usable(gpu_id) for gpu_id in run.gpu_ids)
            ]
            candidates.sort(key=lambda run: (
                not run.checkpointable,
                len(run.gpu_ids) * (now_s - to_seconds(run.started_at)),
                run.id,
            ))
            chosen: list[Run] = []
            have = len(free)
            for run in candidates:
                if have >= job.gpus_needed:
                    break
                chosen.append(run)
                have += len(run.gpu_ids)
            if have < job.gpus_needed:
                continue
            # Never more than needed: drop victims (last taken first) the rest covers.
            for run in list(reversed(chosen)):
                if have - len(run.gpu_ids) >= job.gpus_needed:
                    chosen.remove(run)
                    have -= len(run.gpu_ids)
            key = (
                sum(1 for run in chosen if not run.checkpointable),
                sum(
                    len(run.gpu_ids) * (now_s - to_seconds(run.started_at))
                    for run in chosen if not run.checkpointable
                ),
                sum(len(run.gpu_ids) for run in chosen),
                node,
            )
            if best is None or key < best[0]:
                gpu_ids = free + [gpu_id for run in chosen for gpu_id in run.gpu_ids]
                best = (key, gpu_ids[: job.gpus_needed], chosen)
        if best is None:
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
                )
            )
    stops.sort(key=lambda stop: stop.run_id)
    return stops
