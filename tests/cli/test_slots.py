"""The CLI's pure helpers: finding k GPUs free together, and following a moving log tail."""

import datetime as dt

from gpubook_cli.main import _new_lines, ceil_to_slot
from gpubook_cli.slots import next_slots

T0 = dt.datetime(2026, 12, 2, 9, 0, tzinfo=dt.UTC)
H = dt.timedelta(hours=1)


def test_k_gpus_of_one_node_free_together():
    free = {
        1: [(T0, T0 + 10 * H)],
        2: [(T0 + 2 * H, T0 + 10 * H)],
        3: [(T0, T0 + 1 * H), (T0 + 3 * H, T0 + 10 * H)],
        4: [(T0, T0 + 10 * H)],  # another node: never counted with 1-3
    }
    node_of = {1: "a", 2: "a", 3: "a", 4: "b"}
    found = next_slots(free_by_gpu=free, node_of=node_of, gpus=2, duration=2 * H, earliest=T0, limit=3)
    assert [(s.node, s.start, s.gpu_ids) for s in found] == [
        ("a", T0 + 2 * H, (1, 2)),  # GPU 2 frees at 11:00
        ("a", T0 + 3 * H, (1, 2)),
    ]
    three = next_slots(free_by_gpu=free, node_of=node_of, gpus=3, duration=2 * H, earliest=T0)
    assert [(s.start, s.gpu_ids) for s in three] == [(T0 + 3 * H, (1, 2, 3))]
    assert next_slots(free_by_gpu=free, node_of=node_of, gpus=3, duration=8 * H, earliest=T0) == []


def test_log_tail_overlap_prints_only_new_lines():
    assert _new_lines([], ["a", "b"]) == ["a", "b"]
    assert _new_lines(["a", "b", "c"], ["b", "c", "d"]) == ["d"]
    assert _new_lines(["a", "b"], ["a", "b"]) == []
    assert _new_lines(["x"], ["y", "z"]) == ["y", "z"]  # the window moved past everything printed


def test_starts_round_up_to_the_slot():
    assert ceil_to_slot(T0 + dt.timedelta(minutes=1), 30) == T0 + dt.timedelta(minutes=30)
    assert ceil_to_slot(T0, 30) == T0


def test_suggestions_pack_so_whole_nodes_stay_free():
    """At one start, the node with the fewest GPUs to spare comes first, and on it the GPUs
    whose free time ends soonest: a 2-GPU booking should not split the only free node."""
    whole = {1: [(T0, T0 + 48 * H)], 2: [(T0, T0 + 48 * H)], 3: [(T0, T0 + 48 * H)]}
    partly = {4: [(T0, T0 + 48 * H)], 5: [(T0, T0 + 4 * H)], 6: []}
    node_of = {1: "a", 2: "a", 3: "a", 4: "b", 5: "b", 6: "b"}
    found = next_slots(free_by_gpu=whole | partly, node_of=node_of, gpus=2, duration=2 * H, earliest=T0)
    assert [(s.node, s.gpu_ids) for s in found[:2]] == [("b", (4, 5)), ("a", (1, 2))]
    one = next_slots(free_by_gpu=whole | partly, node_of=node_of, gpus=1, duration=2 * H, earliest=T0, limit=1)
    assert [(s.node, s.gpu_ids) for s in one] == [("b", (5,))]  # GPU 5 is free only 4 h: use it up first
