"""The booking placement rule (scheduler/booking_placement.py), one branch at a time. Its
callers are tested through their own paths: the simulator's booking service in
test_simulation.py, the API in tests/training/test_booking_placement.py."""

import random

import pytest

from scheduler.booking_placement import FREE, ClearingCost, Occupant, choose_gpus, clearing_cost
from scheduler.policy import Policy

POLICY = Policy(grace_s=60.0, non_checkpointable_gap_factor=3.0)
NOW, START = 1_000.0, 10_000.0


def run(*, checkpointable=True, expected_end_s=None, gpus=1, reserved=False, run_id=7):
    return Occupant(run_id=run_id, gpus=gpus, started_at_s=0.0, checkpointable=checkpointable,
                    expected_end_s=expected_end_s, reserved=reserved)


@pytest.mark.parametrize(
    ("occupant", "cost"),
    [
        (None, FREE),
        (run(reserved=True), FREE),  # in its own slot, which the calendar ends first
        (run(gpus=4), ClearingCost(0.0, 4 * 90.0, 0.0, 7)),  # a stop: save and restart, per GPU
        (run(checkpointable=False, gpus=2), ClearingCost(2 * START, 0.0, 0.0, 7)),  # all its work
        (run(expected_end_s=5_000.0), FREE),  # trusted to end first
        (run(checkpointable=False, expected_end_s=2_000.0), ClearingCost(0.0, 0.0, START, 7)),
        # 3 × its 4,000 s estimate ends after the slot's start: certain loss, not risk.
        (run(checkpointable=False, expected_end_s=4_000.0), ClearingCost(START, 0.0, 0.0, 7)),
        # It has outlived its estimate: the estimate says nothing any more.
        (run(expected_end_s=500.0), ClearingCost(0.0, 90.0, 0.0, 7)),
    ],
)
def test_clearing_cost(occupant, cost):
    assert clearing_cost(occupant, start_s=START, now_s=NOW, stop_cost_s=90.0, policy=POLICY) == cost


def _choose(free_by_node, occupants, needed):
    return choose_gpus(free_by_node=free_by_node, occupant_of=occupants.get, needed=needed,
                       start_s=START, now_s=NOW, stop_cost_s=90.0, policy=POLICY)


def test_certain_loss_then_restarts_then_risk_then_node_order():
    wide = run(checkpointable=False, gpus=4, run_id=1)  # certainly loses 4 GPUs' work
    restart = run(gpus=1, run_id=2)  # can checkpoint, no trusted end: stopped and restarted
    risky = run(checkpointable=False, expected_end_s=2_000.0, run_id=3)
    free = [(0, [0, 1]), (1, [2, 3]), (2, [4, 5]), (3, [6, 7]), (4, [8, 9])]
    occupants = {0: wide, 1: wide, 2: restart, 4: risky}
    # Nodes 0-2 each cost something; nodes 3 and 4 nothing: the first of them.
    placement = _choose(free, occupants, 2)
    assert (placement.node, placement.gpu_ids, placement.lost_gpu_s, placement.restart_gpu_s,
            placement.at_risk_gpu_s) == (3, (6, 7), 0.0, 0.0, 0.0)
    # Without them: a risk rather than a restart, a restart rather than certain loss.
    assert _choose(free[:3], occupants, 2).node == 2
    assert _choose(free[:2], occupants, 2).node == 1
    # With only node 0, a run stopped for one GPU counts all its four GPUs, once.
    assert _choose(free[:1], occupants, 2).lost_gpu_s == 4 * START


def test_the_first_node_not_the_fullest():
    # Node 0 is free for the whole slot; node 1 has exactly the two GPUs asked for. Bookings
    # pile up on the first nodes and leave the last ones free for days (wide jobs), so node
    # 0 is taken, though it breaks up a whole node for this slot.
    free = [(0, list(range(8))), (1, [8, 9])]
    assert _choose(free, {}, 2).gpu_ids == (0, 1)
    # Only whether a node costs something counts, not how much: the first node with a
    # restart wins over a later one whose restart is smaller.
    big, small = run(gpus=4, run_id=5), run(gpus=1, run_id=6)
    placement = _choose([(0, [0, 1]), (1, [2, 3])], {0: big, 2: small}, 2)
    assert (placement.node, placement.restart_gpu_s) == (0, 4 * 90.0)
    # Work thrown away still comes first: a run that cannot checkpoint keeps node 0 out.
    unsafe = run(checkpointable=False, gpus=8, run_id=3)
    assert _choose(free, dict.fromkeys(range(8), unsafe), 2).node == 1


def test_idle_gpus_before_risky_ones_and_no_room():
    risky = run(checkpointable=False, expected_end_s=2_000.0)
    assert _choose([(0, [0, 1, 2])], {0: risky}, 2).gpu_ids == (1, 2)
    assert _choose([(0, [0, 1, 2])], {0: risky}, 4) is None


def _every_node_scored(free_by_node, occupants, needed):
    """An oracle for choose_gpus: every node with room scored by the rule's key, the first of
    the cheapest kept (choose_gpus stops at a node that cannot be beaten; this one does not)."""
    scored = []
    for node, free in free_by_node:
        if len(free) < needed:
            continue
        costs = sorted(
            (cost.lost_gpu_s, cost.restart_gpu_s, cost.at_risk_gpu_s,
             -1 if cost.run_id is None else cost.run_id, position, gpu_id)
            for position, gpu_id in enumerate(free)
            for cost in [clearing_cost(occupants.get(gpu_id), start_s=START, now_s=NOW,
                                       stop_cost_s=90.0, policy=POLICY)]
        )[:needed]
        lost = sum({run_id: lost for lost, _, _, run_id, _, _ in costs}.values())
        restart = sum({run_id: restart for _, restart, _, run_id, _, _ in costs}.values())
        at_risk = sum({run_id: risk for _, _, risk, run_id, _, _ in costs}.values())
        scored.append(
            ((lost, restart > 0, at_risk > 0, len(scored)), node,
             tuple(sorted(g for *_, g in costs)))
        )
    if not scored:
        return None
    best = min(scored, key=lambda entry: entry[0])  # min keeps the first of equal keys
    return best[1], best[2]


def test_choose_gpus_agrees_with_scoring_every_node():
    """The shortcuts (skipping nodes that cannot beat the best, idle GPUs priced without a
    call) change no choice, on random clusters of mixed runs."""
    rng = random.Random(15)
    for _ in range(500):
        occupants, free_by_node, gpu = {}, [], 0
        for node in range(rng.randint(1, 6)):
            free = []
            for _ in range(rng.randint(0, 8)):
                if rng.random() < 0.5:
                    occupants[gpu] = run(
                        checkpointable=rng.random() < 0.5, gpus=rng.choice((1, 2, 4)),
                        expected_end_s=rng.choice((None, 500.0, 2_000.0, 4_000.0)),
                        reserved=rng.random() < 0.1, run_id=rng.randint(1, 6),
                    )
                free.append(gpu)
                gpu += 1
            free_by_node.append((node, free))
        needed = rng.randint(1, 8)
        placement = _choose(free_by_node, occupants, needed)
        expected = _every_node_scored(free_by_node, occupants, needed)
        assert (placement and (placement.node, placement.gpu_ids)) == (expected or None)
