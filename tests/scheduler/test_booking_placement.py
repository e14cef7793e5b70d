"""The booking placement rule (scheduler/booking_placement.py), one branch at a time. Its
callers are tested through their own paths: the simulator's booking service in
test_simulation.py, the API in tests/training/test_booking_placement.py."""

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
        (run(gpus=4), ClearingCost(4 * 90.0, 0.0, 7)),  # a stop: save and restart, per GPU
        (run(checkpointable=False, gpus=2), ClearingCost(2 * START, 0.0, 7)),  # all its work
        (run(expected_end_s=5_000.0), FREE),  # trusted to end first
        (run(checkpointable=False, expected_end_s=2_000.0), ClearingCost(0.0, START, 7)),  # at risk
        # 3 × its 4,000 s estimate ends after the slot's start: certain loss, not risk.
        (run(checkpointable=False, expected_end_s=4_000.0), ClearingCost(START, 0.0, 7)),
        # It has outlived its estimate: the estimate says nothing any more.
        (run(expected_end_s=500.0), ClearingCost(90.0, 0.0, 7)),
    ],
)
def test_clearing_cost(occupant, cost):
    assert clearing_cost(occupant, start_s=START, now_s=NOW, stop_cost_s=90.0, policy=POLICY) == cost


def _choose(free_by_node, occupants, needed):
    return choose_gpus(free_by_node=free_by_node, occupant_of=occupants.get, needed=needed,
                       start_s=START, now_s=NOW, stop_cost_s=90.0, policy=POLICY)


def test_certain_loss_then_fullness_then_risk():
    wide = run(checkpointable=False, gpus=4, run_id=1)  # certainly loses 4 GPUs' work
    risky = run(checkpointable=False, expected_end_s=2_000.0, run_id=2)
    free = [(0, [0, 1, 2, 3]), (1, [4, 5]), (2, [6, 7])]
    # Node 0 holds the wide run everywhere; nodes 1 and 2 are fuller; node 1 risks a run.
    occupants = {gpu: wide for gpu in range(4)} | {4: risky, 5: risky}
    placement = _choose(free, occupants, 2)
    assert (placement.node, placement.gpu_ids, placement.lost_gpu_s, placement.at_risk_gpu_s) == (
        2, (6, 7), 0.0, 0.0
    )
    # With node 2 gone, the risk is taken rather than the certain loss.
    assert _choose(free[:2], occupants, 2).gpu_ids == (4, 5)
    # With only node 0, a run stopped for one GPU counts all its four GPUs, once.
    assert _choose(free[:1], occupants, 2).lost_gpu_s == 4 * START


def test_idle_gpus_before_risky_ones_and_no_room():
    risky = run(checkpointable=False, expected_end_s=2_000.0)
    assert _choose([(0, [0, 1, 2])], {0: risky}, 2).gpu_ids == (1, 2)
    assert _choose([(0, [0, 1, 2])], {0: risky}, 4) is None
