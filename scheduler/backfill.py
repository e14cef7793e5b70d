"""Policy: backfill — queued jobs on idle GPUs.

Rule: idle GPUs are active GPUs that no run holds, that no reservation holds now, and whose
next reservation starts more than `grace` from now. Jobs are taken in queue order
(queue_order) and each is placed, if it can be, on GPUs of one node:
1. **fits**: on GPUs whose next reservation starts no earlier than `now + estimate + grace`
   (so it finishes before it would be asked to stop); among the nodes that can host it the
   one with the fewest idle GPUs (keeps whole nodes for big jobs), and on it the GPUs with the
   earliest next reservation that is still late enough (keeps long gaps for long jobs); ties
   by node id, then GPU index. A job that cannot checkpoint instead takes the GPUs whose next
   reservation is latest: if its estimate is wrong it loses all its work, so it gets the
   widest margin there is;
2. otherwise, **preemptible**: if the job is checkpointable, was preempted fewer than
   `max_preemptions` times, and can run at least `min_preemptible_runtime_s` before its
   stop, on the node that gives it the longest run; it is stopped with grace when the
   reservation comes and requeued;
3. otherwise it waits. With `backfill` on, the first `backfill_protected_jobs` waiting jobs
   get the node that frees soonest (from the estimated ends of the runs on it) held for
   them, among those where they could be placed then (`protect_as_placed`: the room before
   a booking that placement asks): later jobs use that node only if estimated to finish
   before then (EASY backfill),
   and never as preemptible backfill. With `backfill` off, the first job that cannot start
   blocks every job behind it (strict order, the FIFO baselines).
A started run's `must_end_by` is the next reservation on its GPUs, capped by the job's
time limit and its team's quota. With `use_estimates` off (baselines), jobs go on the first
node with enough idle GPUs, whatever their length, and are stopped when a reservation comes.
Jobs needing more GPUs than a node has start only with `allow_multi_node`, on whole idle
nodes; otherwise they are never started. At most `max_jobs_examined` jobs are tried per plan
(as Slurm's bf_max_job_test), which bounds a plan's cost when few idle GPUs suit few jobs.
A queue drain's target (queue_drain) goes first, on a node drained for it, as it fits or
preemptible; while it has not started, no other job is placed on those nodes.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import chain

from scheduler.actions import Start
from scheduler.fair_share import FairShare
from scheduler.index import ReservationIndex, Topology
from scheduler.instants import INFINITY, optional_seconds
from scheduler.policy import Policy
from scheduler.queue_drain import DrainTarget
from scheduler.queue_order import CANDIDATE, PROTECT_ONLY, order_queue
from scheduler.quota import QuotaBook
from scheduler.snapshot import Id, Instant, QueuedJob, Run, RunKind

# Failed placements in a row after which backfill asks whether any later job could start.
_FAILURES_BEFORE_CUTOFF = 8

# An idle GPU: (next reservation start, GPU index, GPU id). Lists are kept sorted latest
# reservation first, so the first k entries are the k GPUs with the longest gap.
IdleGpu = tuple[float, int, Id]


@dataclass(slots=True)
class _Placement:
    gpu_ids: tuple[Id, ...]
    must_end_s: float
    preemptible: bool


class _IdleGpus:
    """Idle GPUs per node, in node order, updated as jobs take them. Nodes are also kept in
    buckets by idle count, each in node order, so best-fit looks at the fullest nodes that
    can host a job without scanning every node (a plan starts hundreds of jobs)."""

    def __init__(self, by_node: dict[Id, list[IdleGpu]], node_sizes: dict[Id, int]) -> None:
        self.by_node = by_node
        self.node_sizes = node_sizes
        self.total = sum(len(gpus) for gpus in by_node.values())
        self.buckets: dict[int, list[Id]] = {}
        for node, gpus in by_node.items():  # node order, so each bucket starts sorted
            self.buckets.setdefault(len(gpus), []).append(node)
        self.max_on_a_node = max(self.buckets, default=0)
        # whole_nodes(), kept until a take: every multi-node job tried asks for it.
        self._whole_nodes: list[Id] | None = None

    def nodes_with_at_least(self, needed: int) -> Iterator[tuple[Id, list[IdleGpu]]]:
        """Nodes with `needed` or more idle GPUs: fewest idle first, then node order."""
        for count in range(needed, self.max_on_a_node + 1):
            for node in self.buckets.get(count, ()):
                yield node, self.by_node[node]

    def take(self, node: Id, taken: set[Id]) -> None:
        before = self.by_node[node]
        remaining = [gpu for gpu in before if gpu[2] not in taken]
        self.total -= len(before) - len(remaining)
        bucket = self.buckets[len(before)]
        bucket.pop(bisect.bisect_left(bucket, node))
        if not bucket:
            del self.buckets[len(before)]
        if remaining:
            self.by_node[node] = remaining
            bisect.insort(self.buckets.setdefault(len(remaining), []), node)
        else:
            del self.by_node[node]
        self.max_on_a_node = max(self.buckets, default=0)
        self._whole_nodes = None

    def longest_gap_end_by_size(self) -> list[float]:
        """For k GPUs on one node: the latest "next reservation" any node can offer on k
        idle GPUs at once (index k; index 0 unused)."""
        best = [INFINITY] + [-INFINITY] * self.max_on_a_node
        for gpus in self.by_node.values():
            for count, entry in enumerate(gpus, start=1):
                if entry[0] > best[count]:
                    best[count] = entry[0]
        return best

    def whole_nodes(self) -> list[Id]:
        if self._whole_nodes is None:
            self._whole_nodes = [
                node for node, gpus in self.by_node.items() if len(gpus) == self.node_sizes[node]
            ]
        return self._whole_nodes


def _idle_gpus(
    topology: Topology, occupied: dict[Id, Id], index: ReservationIndex, now_s: float,
    policy: Policy,
) -> _IdleGpus:
    # Set difference runs in C: a busy cluster has few idle GPUs, so the Python loop below
    # touches only those instead of the whole inventory.
    idle_ids = topology.active_gpu_ids.difference(occupied, index.in_progress_on_gpu)
    by_node: dict[Id, list[IdleGpu]] = {}
    next_start = index.next_start_on_gpu
    gpu_by_id = topology.gpu_by_id
    earliest_useful_s = now_s + policy.grace_s
    for gpu_id in idle_ids:
        horizon_s = next_start.get(gpu_id, INFINITY)
        if horizon_s <= earliest_useful_s:
            continue
        gpu = gpu_by_id[gpu_id]
        entry = (horizon_s, gpu.index, gpu_id)
        node_list = by_node.get(gpu.node)
        if node_list is None:
            by_node[gpu.node] = [entry]
        else:
            node_list.append(entry)
    ordered: dict[Id, list[IdleGpu]] = {}
    for node in sorted(by_node):
        idle = by_node[node]
        idle.sort(key=lambda entry: (-entry[0], entry[1]))
        ordered[node] = idle
    return _IdleGpus(ordered, topology.node_sizes)


def _some_job_may_fit(
    queued_jobs: tuple[QueuedJob, ...], idle: _IdleGpus, topology: Topology, now_s: float,
    policy: Policy,
) -> bool:
    """A necessary condition for any start, from whole-queue minima computed in C: idle
    GPUs left next to a reservation are often too short for every job, and a busy cluster
    meets that case at most ticks, so skipping the ordering there is what keeps a plan with
    thousands of queued jobs cheap."""
    sizes = list(map(_GPUS_NEEDED, queued_jobs))
    if min(sizes) <= idle.max_on_a_node:
        estimates = list(map(_ESTIMATE, queued_jobs))
        shortest_s = min(filter(None, estimates), default=INFINITY)
        if None in estimates or 0 in estimates:
            shortest_s = min(shortest_s, policy.default_estimate_s)
        longest_gap_end_s = idle.longest_gap_end_by_size()[1]
        if longest_gap_end_s >= now_s + shortest_s + policy.grace_s:
            return True
        if longest_gap_end_s >= now_s + policy.grace_s + policy.min_preemptible_runtime_s and any(
            map(_CHECKPOINTABLE, queued_jobs)
        ):
            return True
    return (
        policy.allow_multi_node
        and max(sizes) > topology.max_node_size
        and bool(idle.whole_nodes())
    )


def _open_gpus_only(job: QueuedJob, policy: Policy) -> bool:
    """A job that cannot checkpoint and has no estimate goes only where no reservation is
    ahead (`Policy.unknown_non_checkpointable_open_gpus_only`; a rule about estimates, so
    only when placement uses them)."""
    return (
        policy.unknown_non_checkpointable_open_gpus_only
        and policy.use_estimates
        and not job.checkpointable
        and job.estimated_duration_s is None
    )


_GPUS_NEEDED = operator.attrgetter("gpus_needed")
_ESTIMATE = operator.attrgetter("estimated_duration_s")
_CHECKPOINTABLE = operator.attrgetter("checkpointable")


def start_queued_jobs(
    *,
    queued_jobs: tuple[QueuedJob, ...],
    runs: list[Run],
    run_deadlines_s: dict[Id, float],
    fair_share: Callable[[Iterable[tuple[Id, Id]]], FairShare],
    quota: QuotaBook,
    index: ReservationIndex,
    topology: Topology,
    occupied: dict[Id, Id],
    running_jobs: set[Id],
    now_s: float,
    policy: Policy,
    to_instant: Callable[[float], Instant],
    drain_target: DrainTarget | None = None,
) -> list[Start]:
    if not queued_jobs:
        return []
    idle = _idle_gpus(topology, occupied, index, now_s, policy)
    if idle.total == 0:
        return []
    max_node_size = topology.max_node_size
    multi_node = policy.allow_multi_node
    active_gpus = topology.active_gpu_count
    blocked_teams = quota.blocked_teams()
    grace_s = policy.grace_s
    placer = _Placer(
        idle=idle,
        topology=topology,
        occupied=occupied,
        runs=runs,
        run_deadlines_s=run_deadlines_s,
        index=index,
        now_s=now_s,
        policy=policy,
    )
    starts: list[Start] = []

    def begin(job: QueuedJob, placement: _Placement, estimate_s: float) -> None:
        quota.charge(job.team, job.gpus_needed, placement.must_end_s)
        for gpu_id in placement.gpu_ids:
            occupied[gpu_id] = job.id
        running_jobs.add(job.id)
        starts.append(
            Start(
                job_id=job.id,
                gpu_ids=placement.gpu_ids,
                must_end_by=(
                    None if placement.must_end_s == INFINITY else to_instant(placement.must_end_s)
                ),
                kind=RunKind.BACKFILL,
                estimated_end=to_instant(now_s + estimate_s),
                preemptible=placement.preemptible,
            )
        )

    def limit_end_s(job: QueuedJob, estimate_s: float) -> float:
        limit_s = quota.end_cap_s(job.team, job.gpus_needed, estimate_s)
        return limit_s if job.timeout_s is None else min(limit_s, now_s + job.timeout_s)

    if drain_target is not None and drain_target.held_nodes:
        job = drain_target.job
        estimate_s = job.estimated_duration_s or policy.default_estimate_s
        placement = None
        if job.id not in running_jobs and job.team not in blocked_teams:
            placement = placer.place_on_held(
                job, drain_target.held_nodes, limit_end_s(job, estimate_s)
            )
        if placement is not None:
            begin(job, placement, estimate_s)
        else:
            for node in drain_target.held_nodes:
                placer.protected_until[node] = now_s  # no other job fits before "now"
        if idle.total == 0:
            return starts

    if policy.backfill and policy.use_estimates and not _some_job_may_fit(
        queued_jobs, idle, topology, now_s, policy
    ):
        return starts

    if policy.backfill:
        # Order only the jobs that could start now: a job's key does not depend on which
        # others are candidates, so filtering first keeps the order exact and saves keying
        # jobs that cannot use these idle GPUs (e.g. long jobs facing a short gap).
        limit = idle.total if multi_node else idle.max_on_a_node
        max_on_a_node = idle.max_on_a_node
        longest_gap_end_s = idle.longest_gap_end_by_size()
        use_estimates = policy.use_estimates
        default_estimate_s = policy.default_estimate_s
        preemptible_end_s = now_s + grace_s + policy.min_preemptible_runtime_s
        max_preemptions = policy.max_preemptions

        protecting = policy.backfill_protected_jobs > 0 and use_estimates
        safe_factor = policy.non_checkpointable_gap_factor
        open_gpus_only = policy.unknown_non_checkpointable_open_gpus_only

        def classify(job: QueuedJob) -> int | None:
            needed = job.gpus_needed
            if job.id in running_jobs or job.team in blocked_teams or needed < 1:
                return None
            if needed > max_node_size:
                if not multi_node or needed > active_gpus:
                    return None
                return CANDIDATE if needed <= limit else (PROTECT_ONLY if protecting else None)
            if needed > max_on_a_node:
                return PROTECT_ONLY if protecting else None
            if not use_estimates:
                return CANDIDATE
            gap_end_s = longest_gap_end_s[needed]
            estimate_s = job.estimated_duration_s or default_estimate_s
            if not job.checkpointable:
                estimate_s *= safe_factor
                if open_gpus_only and job.estimated_duration_s is None:
                    # No estimate: only GPUs with no reservation ahead will do.
                    gap_end_s = INFINITY if gap_end_s == INFINITY else -INFINITY
            if gap_end_s >= now_s + estimate_s + grace_s or (
                job.checkpointable
                and job.times_preempted < max_preemptions
                and gap_end_s >= preemptible_end_s
            ):
                return CANDIDATE
            return PROTECT_ONLY if protecting else None
    else:

        def classify(job: QueuedJob) -> int | None:
            needed = job.gpus_needed
            if (
                0 < needed <= active_gpus
                and (needed <= max_node_size or multi_node)
                and job.id not in running_jobs
                and job.team not in blocked_teams
            ):
                return CANDIDATE
            return None

    ordered, protect_only = order_queue(
        queued_jobs=queued_jobs,
        runs=runs,
        fair_share=fair_share,
        quota=quota,
        classify=classify,
        now_s=now_s,
        policy=policy,
    )
    # The best-ranked job that cannot fit now; it is protected once candidates behind it
    # are about to be placed (EASY: the head reserves, the rest backfill around it).
    # Fetched on first need: strict FIFO never asks.
    waiting_head: tuple | None = None
    waiting_fetched = False
    # Once the idle GPUs are taken or held for the protected job, the candidates behind
    # mostly cannot start any more, yet ordering and trying each costs more than the rest
    # of the plan. After a run of failures, ask whether any job not yet ordered could still
    # be placed (a necessary condition, on the idle GPUs and protections as they are now)
    # and stop if none could: the same starts, for a fraction of the work. Asked again
    # only after the idle GPUs or the protections change.
    failures = 0
    asked_at: tuple[int, int] | None = None
    cutoff = policy.backfill and policy.use_estimates
    # Each "yes, some job may still start" doubles the run of failures before the next
    # question, so a plan that keeps placing jobs pays for a few scans, not one per start.
    patience = _FAILURES_BEFORE_CUTOFF
    for examined, (key, job) in enumerate(ordered):
        if idle.total == 0 or examined >= policy.max_jobs_examined:
            break
        if cutoff and failures >= patience:
            state = (idle.total, len(placer.protected_until))
            if state != asked_at:
                asked_at = state
                if not placer.could_place_any(chain((job,), ordered.remaining())):
                    break
                patience *= 2
        while policy.backfill and placer.protected_jobs < policy.backfill_protected_jobs:
            if not waiting_fetched:
                waiting_head, waiting_fetched = next(protect_only, None), True
            if waiting_head is None or not waiting_head[0] < key:
                break
            placer.maybe_protect(waiting_head[1])
            waiting_head = next(protect_only, None)
        if job.gpus_needed > (idle.total if multi_node else idle.max_on_a_node):
            if not policy.backfill:
                break
            placer.maybe_protect(job)
            failures += 1
            continue
        estimate_s = job.estimated_duration_s or policy.default_estimate_s
        placement = placer.place(job, limit_end_s(job, estimate_s))
        if placement is None:
            if not policy.backfill:
                break
            placer.maybe_protect(job)
            failures += 1
            continue
        failures = 0
        begin(job, placement, estimate_s)
    return starts


class _Placer:
    def __init__(
        self,
        *,
        idle: _IdleGpus,
        topology: Topology,
        occupied: dict[Id, Id],
        runs: list[Run],
        run_deadlines_s: dict[Id, float],
        index: ReservationIndex,
        now_s: float,
        policy: Policy,
    ) -> None:
        self.idle = idle
        self.topology = topology
        self.occupied = occupied
        self.runs = runs
        self.run_deadlines_s = run_deadlines_s
        self.index = index
        self.now_s = now_s
        self.policy = policy
        # Node → the time until which it is held for a protected job.
        self.protected_until: dict[Id, float] = {}
        self.protected_jobs = 0
        self._ready_by_gpu: dict[Id, float] | None = None

    # ----- placing

    def place(self, job: QueuedJob, limit_end_s: float) -> _Placement | None:
        needed = job.gpus_needed
        if needed > self.topology.max_node_size:
            return self._place_on_whole_nodes(job, limit_end_s)
        policy = self.policy
        if not policy.use_estimates:
            return self._place_anywhere(needed, limit_end_s)
        estimate_s = job.estimated_duration_s or policy.default_estimate_s
        if not job.checkpointable:
            estimate_s *= policy.non_checkpointable_gap_factor
        fitting = self._place_fitting(
            needed, estimate_s, limit_end_s, safest=not job.checkpointable,
            open_only=_open_gpus_only(job, policy),
        )
        if fitting is not None or not self._may_preempt(job):
            return fitting
        return self._place_preemptible(needed, limit_end_s)

    def place_on_held(
        self, job: QueuedJob, nodes: frozenset[Id], limit_end_s: float
    ) -> _Placement | None:
        """A drain's target on a node drained for it (one node: drains are for one-node
        jobs): as it fits if it does, else preemptible if it may be, as `place` would."""
        needed = job.gpus_needed
        policy = self.policy
        estimate_s = job.estimated_duration_s or policy.default_estimate_s
        if not job.checkpointable:
            estimate_s *= policy.non_checkpointable_gap_factor
        fits_end_s = self.now_s + estimate_s + policy.grace_s
        preemptible_end_s = self.now_s + policy.grace_s + policy.min_preemptible_runtime_s
        open_only = _open_gpus_only(job, policy)
        for node in sorted(nodes):
            gpus = self.idle.by_node.get(node, [])
            if len(gpus) < needed:
                continue
            chosen = gpus[:needed]  # the latest next reservations
            end_s = min(chosen[-1][0], limit_end_s)
            if end_s >= fits_end_s and not (open_only and chosen[-1][0] != INFINITY):
                return self._finish(node, chosen, limit_end_s, preemptible=False)
            if self._may_preempt(job) and end_s >= preemptible_end_s:
                return self._finish(node, chosen, limit_end_s, preemptible=True)
        return None

    def could_place_any(self, jobs: Iterable[QueuedJob]) -> bool:
        """False only if `place` would fail for every job of `jobs` now (estimates on): each
        needs, on one node, as many idle GPUs whose next reservation leaves room for its
        (factored) estimate, on a node not held for a protected job or held long enough; or,
        if it may be preempted, an unheld node with room for the minimum preemptible run.
        Quotas and time limits are left out: they only make `place` fail more. Sizes beyond
        a node count as placeable while enough GPUs are idle (whole-node placement)."""
        now_s = self.now_s
        policy = self.policy
        grace_s = policy.grace_s
        # Per GPU count k: the longest (factored) estimate some node can fit, and the latest
        # next reservation among unheld nodes (for preemptible runs).
        fit_s = [-INFINITY] * (self.idle.max_on_a_node + 1)
        unheld_end_s = [-INFINITY] * (self.idle.max_on_a_node + 1)
        protected_until = self.protected_until
        for node, gpus in self.idle.by_node.items():
            held_s = protected_until.get(node)
            for count, entry in enumerate(gpus, start=1):
                room_s = entry[0] - now_s - grace_s
                if held_s is None:
                    if entry[0] > unheld_end_s[count]:
                        unheld_end_s[count] = entry[0]
                elif held_s - now_s < room_s:
                    room_s = held_s - now_s
                if room_s > fit_s[count]:
                    fit_s[count] = room_s
        max_node_size = self.topology.max_node_size
        largest = self.idle.max_on_a_node
        default_estimate_s = policy.default_estimate_s
        factor = policy.non_checkpointable_gap_factor
        preemptible_end_s = now_s + grace_s + policy.min_preemptible_runtime_s
        max_preemptions = policy.max_preemptions
        # Float slack: a borderline job counts as placeable (asking again costs little).
        slack_s = 1e-6
        for job in jobs:
            needed = job.gpus_needed
            if needed > max_node_size:
                if policy.allow_multi_node and needed <= self.idle.total:
                    return True
                continue
            if needed > largest:
                continue
            estimate_s = job.estimated_duration_s or default_estimate_s
            if not job.checkpointable:
                estimate_s *= factor
            elif (
                job.times_preempted < max_preemptions
                and unheld_end_s[needed] >= preemptible_end_s - slack_s
            ):
                return True
            if estimate_s <= fit_s[needed] + slack_s:
                return True
        return False

    def _may_preempt(self, job: QueuedJob) -> bool:
        return job.checkpointable and job.times_preempted < self.policy.max_preemptions

    def _finish(self, node: Id, chosen: list[IdleGpu], limit_end_s: float, preemptible: bool
                ) -> _Placement:
        must_end_s = min(min(entry[0] for entry in chosen), limit_end_s)
        gpu_ids = tuple(entry[2] for entry in sorted(chosen, key=lambda entry: entry[1]))
        self.idle.take(node, set(gpu_ids))
        return _Placement(gpu_ids, must_end_s, preemptible)

    def _place_fitting(
        self, needed: int, estimate_s: float, limit_end_s: float, *, safest: bool,
        open_only: bool = False,
    ) -> _Placement | None:
        """Fit before the next reservation. `safest` (a job that cannot checkpoint, so a wrong
        estimate loses all its work): take the GPUs with the latest next reservation
        instead of the tightest gap that suffices. `open_only`: only GPUs with no
        reservation ahead."""
        now_s = self.now_s
        required_end_s = now_s + estimate_s + self.policy.grace_s
        if limit_end_s < required_end_s:
            return None
        best_node = None
        best_horizon_s = -INFINITY
        protected_until = self.protected_until
        for node, gpus in self.idle.nodes_with_at_least(needed):
            horizon_s = gpus[needed - 1][0]
            if horizon_s < required_end_s or (open_only and horizon_s != INFINITY):
                continue
            if protected_until and protected_until.get(node, INFINITY) < now_s + estimate_s:
                continue
            if not safest:
                best_node = node
                break
            if horizon_s > best_horizon_s:
                best_node, best_horizon_s = node, horizon_s
                if horizon_s == INFINITY:
                    break
        if best_node is None:
            return None
        gpus = self.idle.by_node[best_node]
        if safest:
            # Latest next reservation first (the list's own order), then the lowest indexes.
            return self._finish(best_node, gpus[:needed], limit_end_s, preemptible=False)
        # The earliest next reservations that still leave room, then the lowest indexes.
        late_enough = sorted(
            (entry for entry in gpus if entry[0] >= required_end_s),
            key=lambda entry: (entry[0], entry[1]),
        )
        return self._finish(best_node, late_enough[:needed], limit_end_s, preemptible=False)

    def _place_preemptible(self, needed: int, limit_end_s: float) -> _Placement | None:
        now_s = self.now_s
        minimum_end_s = now_s + self.policy.grace_s + self.policy.min_preemptible_runtime_s
        if limit_end_s < minimum_end_s:
            return None
        best_node = None
        best_key: tuple[float, int] | None = None
        for node, gpus in self.idle.by_node.items():
            if len(gpus) < needed or node in self.protected_until:
                continue
            end_s = min(gpus[needed - 1][0], limit_end_s)
            if end_s < minimum_end_s:
                continue
            key = (-end_s, len(gpus))
            if best_key is None or key < best_key:
                best_node, best_key = node, key
        if best_node is None:
            return None
        return self._finish(
            best_node, self.idle.by_node[best_node][:needed], limit_end_s, preemptible=True
        )

    def _place_anywhere(self, needed: int, limit_end_s: float) -> _Placement | None:
        if limit_end_s <= self.now_s + self.policy.grace_s:
            return None
        for node, gpus in self.idle.by_node.items():
            if len(gpus) >= needed:
                chosen = sorted(gpus, key=lambda entry: entry[1])[:needed]
                return self._finish(node, chosen, limit_end_s, preemptible=False)
        return None

    def _place_on_whole_nodes(self, job: QueuedJob, limit_end_s: float) -> _Placement | None:
        """Multi-node jobs take whole idle nodes in node order; the leftover GPUs of the last
        node stay idle for others."""
        if not self.policy.allow_multi_node:
            return None
        policy = self.policy
        now_s = self.now_s
        estimate_s = job.estimated_duration_s or policy.default_estimate_s
        if not job.checkpointable:
            estimate_s *= policy.non_checkpointable_gap_factor
        # Without estimates any gap longer than the grace will do (the baselines).
        fit_s = estimate_s if policy.use_estimates else 0.0
        attempts = [(now_s + fit_s + policy.grace_s, False)]
        open_only = _open_gpus_only(job, policy)
        if policy.use_estimates and self._may_preempt(job):
            attempts.append((now_s + policy.grace_s + policy.min_preemptible_runtime_s, True))
        for minimum_end_s, preemptible in attempts:
            if limit_end_s < minimum_end_s:
                continue
            chosen_nodes: list[Id] = []
            gathered = 0
            for node in self.idle.whole_nodes():
                gpus = self.idle.by_node[node]
                held_s = self.protected_until.get(node)
                if held_s is not None and (
                    preemptible or not policy.protect_as_placed or held_s < now_s + fit_s
                ):
                    continue
                if gpus[-1][0] < minimum_end_s or (
                    open_only and not preemptible and gpus[-1][0] != INFINITY
                ):
                    continue
                chosen_nodes.append(node)
                gathered += len(gpus)
                if gathered >= job.gpus_needed:
                    break
            if gathered < job.gpus_needed:
                continue
            gpu_ids: list[Id] = []
            must_end_s = limit_end_s
            for node in chosen_nodes:
                take = sorted(self.idle.by_node[node], key=lambda entry: entry[1])
                take = take[: job.gpus_needed - len(gpu_ids)]
                must_end_s = min(must_end_s, min(entry[0] for entry in take))
                gpu_ids.extend(entry[2] for entry in take)
                self.idle.take(node, {entry[2] for entry in take})
            return _Placement(tuple(gpu_ids), must_end_s, preemptible)
        return None

    # ----- EASY protection

    def maybe_protect(self, job: QueuedJob) -> None:
        if self.protected_jobs >= self.policy.backfill_protected_jobs:
            return
        if not self.policy.use_estimates:
            return
        self.protected_jobs += 1
        ready = self._ready_times()
        node_ready: list[tuple[float, Id]] = []
        needed = job.gpus_needed
        active = self.topology.active_gpu_ids
        now_s = self.now_s
        next_start = self.index.next_start_on_gpu
        # A GPU whose next reservation comes before the job could finish is no use to it
        # until after that reservation, whose end is not indexed: treat it as never.
        span_s = self._hold_span_s(job)

        ready_at = ready.get
        next_start_at = next_start.get
        protected_until = self.protected_until
        for node, gpu_ids in self.topology.node_gpu_ids.items():
            if node in protected_until:
                continue
            # When each GPU is ready for this job (inlined: a plan may visit every GPU here).
            times = sorted([
                INFINITY
                if gpu_id not in active
                or (at_s := ready_at(gpu_id, now_s)) + span_s > next_start_at(gpu_id, INFINITY)
                else at_s
                for gpu_id in gpu_ids
            ])
            if needed <= len(times):
                node_ready.append((times[needed - 1], node))
            elif needed > self.topology.max_node_size and len(times) == (
                self.topology.max_node_size
            ):
                node_ready.append((times[-1], node))
        if not node_ready:
            return
        node_ready.sort(key=lambda entry: (entry[0], entry[1]))
        nodes_needed = 1
        if needed > self.topology.max_node_size:
            nodes_needed = -(-needed // self.topology.max_node_size)
        chosen = node_ready[:nodes_needed]
        shadow_s = max(entry[0] for entry in chosen)
        if shadow_s == INFINITY:
            return
        for _, node in chosen:
            self.protected_until[node] = shadow_s

    def _hold_span_s(self, job: QueuedJob) -> float:
        """How long before its next reservation a GPU must be free to count for the held
        job. With `protect_as_placed`, the room `place` would ask of it: its estimate times
        the gap factor if it cannot checkpoint, and no reservation at all ahead if it has no
        estimate either (an infinite span leaves only GPUs with nothing booked)."""
        policy = self.policy
        estimate_s = job.estimated_duration_s or policy.default_estimate_s
        if policy.protect_as_placed:
            if _open_gpus_only(job, policy):
                return INFINITY
            if not job.checkpointable:
                estimate_s *= policy.non_checkpointable_gap_factor
        return estimate_s + policy.grace_s

    def _ready_times(self) -> dict[Id, float]:
        """When each GPU not idle now is expected to be free: the estimated end (or the
        deadline) of the run on it, the end of the reservation holding it, never if it was
        just taken by this plan or a reservation is about to take it. GPUs missing from
        the map are idle now (if active)."""
        if self._ready_by_gpu is not None:
            return self._ready_by_gpu
        now_s = self.now_s
        # Taken by a start earlier in this plan (runs are overwritten just below).
        ready: dict[Id, float] = dict.fromkeys(self.occupied, INFINITY)
        deadline_of = self.run_deadlines_s.get
        for run in self.runs:
            estimated_end = run.estimated_end
            if estimated_end is None:
                end_s = INFINITY
            elif estimated_end.__class__ is float:
                end_s = estimated_end
            else:
                end_s = optional_seconds(estimated_end)
            deadline_s = deadline_of(run.id, INFINITY)
            if deadline_s < end_s:
                end_s = deadline_s
            if end_s == INFINITY:
                end_s = optional_seconds(run.must_end_by)
            end_s = max(end_s, now_s)
            for gpu_id in run.gpu_ids:
                ready[gpu_id] = end_s
        for gpu_id, item in self.index.in_progress_on_gpu.items():
            if gpu_id not in ready:
                ready[gpu_id] = item.end_s
        soon_s = now_s + self.policy.grace_s
        for gpu_id, start_s in self.index.next_start_on_gpu.items():
            if start_s <= soon_s and gpu_id not in ready:
                # The end of that reservation is not indexed; it is at least a slot away.
                ready[gpu_id] = INFINITY
        self._ready_by_gpu = ready
        return ready
