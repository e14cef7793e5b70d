"""Which GPUs a new booking of N GPUs should take, around the runs of the moment (#15).

A booking wins over backfill: at its start every run on its GPUs is stopped. So where a
booking goes decides what it costs the queued work, and the booking service (the simulator's,
and production's "choose the GPUs for me") asks here. One rule for both:

1. **Work thrown away first**: GPU-seconds of work lost for good if the GPU must be free
   at the slot's start: nothing for an idle GPU, a run trusted to end by then or a run that
   can checkpoint; all the work since its start for one that cannot. A run loses on all its
   GPUs, however few of them the booking takes (a 32-GPU run stopped for one booked GPU
   loses 32 GPUs' work), and counts once however many of its GPUs are taken.
2. **Then no restart**: a node where no checkpointable run must stop (save and restart:
   minutes of its GPUs, not its work) before one where some must.
3. **Then no work at risk**: a node where no run that cannot checkpoint is merely trusted to
   end in time (it loses nothing if its estimate holds, all its work if not: estimates have
   a heavy tail, a 26-minute estimate for a 41-hour run on philly) before one where some is.
   Within the chosen node, too, idle GPUs and safe runs go before risky ones.
4. **Then node order**: the first node in the calendar's order, not the fullest one. Bookings
   then pile up on the same first nodes slot after slot and the last nodes stay free of them
   for days, which is what wide and long jobs need; "the fullest node for this slot" is a
   different node each slot, so bookings were sprinkled over every node and left none free
   for long. #15 matrix, sixteenth round (BENCHMARKS.md): rows meeting every target 9 → 10
   on seeds 1-4, 8 → 10 on 5-8, 6 → 7 on 9-12, ITP 0.95 / 35 %'s lost work 2.7 → 0.9 % of
   capacity. Steps 2 and 3 ask only whether, not how much: weighing them sends bookings to
   later nodes (the restarts weighed: 10 rows on seeds 1-4 but 9 on 5-8; the restarts and
   the risk: 9 and 9); without step 3, the same rows but more work lost (helios 0.95 / 20 %:
   0.0 → 0.8 % of capacity); the fullest node before node order (as until this round): 8.

A run's estimate is trusted only when it comes from history (a default or a user's guess
says nothing) and the run has not outlived it, and for a run that cannot checkpoint only with
the policy's conservative margin (`Policy.non_checkpointable_gap_factor`), as backfill places
such runs. Pure: the caller says which GPUs are free in the calendar and what runs on them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from scheduler.policy import Policy
from scheduler.snapshot import Id


@dataclass(frozen=True, slots=True)
class Occupant:
    """The run holding a GPU now, as the booking service sees it."""

    run_id: Id
    gpus: int  # all the run's GPUs: a stop loses on every one of them
    started_at_s: float
    checkpointable: bool
    # Its expected end, only when the estimate comes from history (None: nothing trusted).
    expected_end_s: float | None = None
    # A run in its own booked slot: the calendar already says it ends before this booking.
    reserved: bool = False


@dataclass(frozen=True, slots=True)
class ClearingCost:
    lost_gpu_s: float  # work thrown away
    restart_gpu_s: float  # a checkpointable run's save and restart
    at_risk_gpu_s: float  # work lost only if a trusted estimate is wrong
    run_id: Id | None  # None: nothing to stop


FREE = ClearingCost(0.0, 0.0, 0.0, None)


@dataclass(frozen=True, slots=True)
class Placement:
    node: Id
    gpu_ids: tuple[Id, ...]
    lost_gpu_s: float
    restart_gpu_s: float
    at_risk_gpu_s: float


def clearing_cost(
    occupant: Occupant | None, *, start_s: float, now_s: float, stop_cost_s: float,
    policy: Policy,
) -> ClearingCost:
    """What freeing a GPU held by `occupant` by `start_s` costs, as can be told at `now_s`.
    `stop_cost_s`: what stopping a run that can checkpoint costs it per GPU (its save and
    its restart)."""
    if occupant is None or occupant.reserved:
        return FREE
    work_gpu_s = occupant.gpus * (max(start_s, now_s) - occupant.started_at_s)
    expected_end_s = occupant.expected_end_s
    if expected_end_s is not None:
        if not occupant.checkpointable:
            expected_end_s = occupant.started_at_s + policy.non_checkpointable_gap_factor * (
                expected_end_s - occupant.started_at_s
            )
        if now_s < expected_end_s and expected_end_s + policy.grace_s <= start_s:
            if occupant.checkpointable:
                return FREE
            return ClearingCost(0.0, 0.0, work_gpu_s, occupant.run_id)
    if occupant.checkpointable:
        return ClearingCost(0.0, occupant.gpus * stop_cost_s, 0.0, occupant.run_id)
    return ClearingCost(work_gpu_s, 0.0, 0.0, occupant.run_id)


def choose_gpus(
    *,
    free_by_node: Iterable[tuple[Id, Sequence[Id]]],
    occupant_of: Callable[[Id], Occupant | None],
    needed: int,
    start_s: float,
    now_s: float,
    stop_cost_s: float,
    policy: Policy,
) -> Placement | None:
    """The `needed` GPUs of one node to book for a slot starting at `start_s`, from the GPUs
    free in the calendar for the whole slot (`free_by_node`: node → its free GPUs, in the node
    order rule 4 follows); None if no node has that many free."""
    best: tuple | None = None
    for position, (node, free) in enumerate(free_by_node):
        if len(free) < needed:
            continue
        costs = []
        for index, gpu_id in enumerate(free):
            occupant = occupant_of(gpu_id)
            if occupant is None:
                costs.append((0.0, 0.0, 0.0, -1, index, gpu_id))
                continue
            cost = clearing_cost(
                occupant, start_s=start_s, now_s=now_s, stop_cost_s=stop_cost_s, policy=policy,
            )
            run_order = -1 if cost.run_id is None else cost.run_id
            costs.append((
                cost.lost_gpu_s, cost.restart_gpu_s, cost.at_risk_gpu_s, run_order, index,
                gpu_id,
            ))
        costs.sort()
        taken = costs[:needed]
        # Each run stopped counts once, however many of its GPUs are taken.
        lost, restart, at_risk = {}, {}, {}
        for lost_gpu_s, restart_gpu_s, at_risk_gpu_s, run, _, _ in taken:
            lost[run], restart[run], at_risk[run] = lost_gpu_s, restart_gpu_s, at_risk_gpu_s
        sums = (sum(lost.values()), sum(restart.values()), sum(at_risk.values()))
        key = (sums[0], sums[1] > 0, sums[2] > 0, position)
        if best is None or key < best[0]:
            best = (key, node, tuple(sorted(gpu_id for *_, gpu_id in taken)), sums)
            if key[:3] == (0.0, False, False):
                break  # nothing thrown away, restarted or at risk: no later node beats it
    if best is None:
        return None
    _, node, gpu_ids, (lost_gpu_s, restart_gpu_s, at_risk_gpu_s) = best
    return Placement(node, gpu_ids, lost_gpu_s, restart_gpu_s, at_risk_gpu_s)
