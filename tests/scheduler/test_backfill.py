"""Backfill: which queued job goes on which idle GPUs, with what must_end_by."""

from __future__ import annotations

import pytest

from scheduler import GpuState, Policy, Priority, RunKind, Start, TeamAccount, plan
from tests.scheduler.builders import GRACE_S, gpus, job, of_type, reservation, run, snapshot

POLICY = Policy(grace_s=GRACE_S, min_preemptible_runtime_s=900.0)
RESERVED_AT = 4000.0


def _node0_booked_at(start: float = RESERVED_AT):
    """Node 0 has a reservation on all 8 GPUs at `start`; node 1 is fully busy."""
    return dict(
        reservations=(reservation(1, tuple(range(8)), start, start + 3600.0, job_id=77),),
        runs=(run(9, tuple(range(100, 108))),),
    )


def starts_of(state, now=0.0, policy=POLICY) -> list[Start]:
    return of_type(plan(state, now, policy), Start)


@pytest.mark.parametrize(
    ("estimate_s", "checkpointable", "times_preempted", "expected_preemptible"),
    [
        (3000.0, False, 0, False),  # 3000 + grace ends before 4000: fits
        (3940.0, False, 0, False),  # exactly up to the stop time: fits
        (3941.0, False, 0, None),  # would be stopped, cannot checkpoint: waits
        (10_000.0, True, 0, True),  # does not fit, checkpointable: preemptible backfill
        (10_000.0, True, 3, None),  # preempted too often: only where it fits
    ],
)
def test_fit_before_the_next_reservation_or_preemptible(
    estimate_s, checkpointable, times_preempted, expected_preemptible
):
    queued = job(1, 2, estimate_s=estimate_s, checkpointable=checkpointable,
                 times_preempted=times_preempted)
    # The estimate taken at its word (factor 1) for the jobs that cannot checkpoint.
    trusting = Policy(grace_s=GRACE_S, min_preemptible_runtime_s=900.0,
                      non_checkpointable_gap_factor=1.0)
    starts = starts_of(snapshot(queued_jobs=(queued,), **_node0_booked_at()), policy=trusting)
    if expected_preemptible is None:
        assert starts == []
        return
    (start,) = starts
    assert start.kind == RunKind.BACKFILL
    assert start.must_end_by == RESERVED_AT
    assert start.preemptible is expected_preemptible
    assert start.estimated_end == estimate_s


@pytest.mark.parametrize(("estimate_s", "fits"), [(1313.0, True), (1314.0, False)])
def test_a_job_that_cannot_checkpoint_needs_a_gap_of_three_times_its_estimate(estimate_s, fits):
    # Default factor 3: 3 x 1313 + 60 = 3999 <= 4000 (the reservation); 1314 is too long.
    assert POLICY.non_checkpointable_gap_factor == 3.0
    queued = job(1, 2, estimate_s=estimate_s, checkpointable=False)
    starts = starts_of(snapshot(queued_jobs=(queued,), **_node0_booked_at()))
    assert len(starts) == (1 if fits else 0)
    if fits:
        # What it expects to need stays its own estimate; only the gap it needs grows.
        assert starts[0].estimated_end == estimate_s


@pytest.mark.parametrize(
    ("estimate_s", "open_gpus_only", "starts"),
    [
        (None, True, False),  # no estimate at all: a gap of any length may be too short
        (None, False, True),  # the old rule: 3 x the 1 h default fits the 20 h gap
        (3600.0, True, True),  # an estimate (history or the user's) is used as before
    ],
)
def test_a_job_that_cannot_checkpoint_without_an_estimate_needs_gpus_with_no_booking_ahead(
    estimate_s, open_gpus_only, starts
):
    far_s = 20 * 3600.0
    policy = Policy(grace_s=GRACE_S, unknown_non_checkpointable_open_gpus_only=open_gpus_only)
    queued = job(1, 2, estimate_s=estimate_s, checkpointable=False)
    state = snapshot(queued_jobs=(queued,), **_node0_booked_at(far_s))
    assert [start.must_end_by for start in starts_of(state, policy=policy)] == (
        [far_s] if starts else []
    )
    # GPUs with nothing booked ahead take it either way (node 1 free instead of busy).
    free = snapshot(queued_jobs=(queued,), reservations=_node0_booked_at(far_s)["reservations"])
    assert [start.gpu_ids for start in starts_of(free, policy=policy)] == [(100, 101)]


def test_a_wide_job_that_cannot_checkpoint_without_an_estimate_takes_only_open_nodes():
    # 12 GPUs on whole nodes: node 0 has a booking in 20 h, nodes 1 and 2 none.
    policy = Policy(grace_s=GRACE_S, allow_multi_node=True)
    queued = job(1, 12, estimate_s=None, checkpointable=False)
    booked = (reservation(1, (0,), 20 * 3600.0, 21 * 3600.0, job_id=77),)
    state = snapshot(gpus=gpus(nodes=3), queued_jobs=(queued,), reservations=booked)
    (start,) = starts_of(state, policy=policy)
    assert {gpu_id // 100 for gpu_id in start.gpu_ids} == {1, 2}
    assert start.must_end_by is None
    busy_node_2 = snapshot(gpus=gpus(nodes=3), queued_jobs=(queued,), reservations=booked,
                           runs=(run(9, tuple(range(200, 208))),))
    assert starts_of(busy_node_2, policy=policy) == []


def test_preemptible_backfill_needs_its_minimum_runtime():
    queued = job(1, 1, estimate_s=10_000.0)
    # 4000 - 60 - 3100 = 840 s of runtime < 900 s: not worth a restart.
    assert starts_of(snapshot(queued_jobs=(queued,), **_node0_booked_at()), now=3100.0) == []
    assert len(starts_of(snapshot(queued_jobs=(queued,), **_node0_booked_at()), now=3000.0)) == 1


def test_gpus_too_close_to_a_reservation_are_not_idle():
    queued = job(1, 1, estimate_s=1.0)
    state = snapshot(queued_jobs=(queued,), **_node0_booked_at())
    assert starts_of(state, now=RESERVED_AT - GRACE_S) == []


def test_best_fit_node_keeps_whole_nodes_for_big_jobs():
    # Node 0 has 2 idle GPUs, node 1 has 8: a 1-GPU job goes to node 0.
    state = snapshot(runs=(run(9, tuple(range(2, 8))),), queued_jobs=(job(1, 1),))
    (start,) = starts_of(state)
    assert start.gpu_ids == (0,)


def test_time_best_fit_takes_the_shortest_gap_that_suffices():
    # GPU 0 reserved at 1000, GPU 1 at 5000, GPUs 2..7 never: a 600 s job takes GPU 0.
    state = snapshot(
        gpus=gpus(nodes=1),
        reservations=(reservation(1, (0,), 1000.0, 2000.0), reservation(2, (1,), 5000.0, 6000.0)),
        queued_jobs=(job(1, 1, estimate_s=600.0), job(2, 1, estimate_s=4000.0, submitted_at=1)),
    )
    starts = {start.job_id: start for start in starts_of(state, policy=Policy(release_no_show=False))}
    assert starts[1].gpu_ids == (0,)
    assert starts[1].must_end_by == 1000.0
    assert starts[2].gpu_ids == (1,)


def test_strict_order_blocks_behind_the_head_when_backfill_is_off():
    # Without size lanes, so the 8-GPU job submitted first is the head.
    strict = Policy(backfill=False, use_estimates=False, size_lane_weight=0.0)
    state = snapshot(
        runs=(run(9, tuple(range(100, 108))), run(8, (0, 1))),
        queued_jobs=(job(1, 8, submitted_at=0.0), job(2, 1, submitted_at=1.0)),
    )
    assert starts_of(state, policy=strict) == []
    assert [start.job_id for start in starts_of(state)] == [2]


def test_easy_protection_keeps_the_soonest_node_for_the_blocked_head():
    # Node 0: 7 GPUs busy until ~1000 (estimated), 1 idle. Node 1: busy for a long time.
    # The 8-GPU head job waits for node 0; a long 1-GPU job must not delay it, a short one may.
    state = snapshot(
        runs=(
            run(8, tuple(range(1, 8)), estimated_end=1000.0),
            run(9, tuple(range(100, 108)), estimated_end=90_000.0),
        ),
        queued_jobs=(
            job(1, 8, submitted_at=0.0, estimate_s=3600.0, priority=Priority.HIGH),
            job(2, 1, submitted_at=1.0, estimate_s=50_000.0, user="bob"),
            job(3, 1, submitted_at=2.0, estimate_s=500.0, user="carol"),
        ),
    )
    starts = starts_of(state, now=10.0)
    assert [start.job_id for start in starts] == [3]
    # Without protection (and without size lanes, which would rank the short job first
    # anyway) the long job 2, next in order, takes the idle GPU.
    unprotected = Policy(backfill_protected_jobs=0, size_lane_weight=0.0)
    assert starts_of(state, now=10.0, policy=unprotected)[0].job_id == 2


def test_a_wide_job_is_held_for_although_size_lanes_rank_it_last():
    # As above, with a wide job of 8 GPUs x 10 h (lane 10) and a narrow long one (lane 8):
    # among jobs that can start the narrow one would come first, but the job to hold a node
    # for is ranked without lanes, so the wide job gets node 0 and the narrow one waits.
    state = snapshot(
        runs=(
            run(8, tuple(range(1, 8)), estimated_end=1000.0),
            run(9, tuple(range(100, 108)), estimated_end=90_000.0),
        ),
        queued_jobs=(
            job(1, 8, submitted_at=0.0, estimate_s=36_000.0),
            job(2, 1, submitted_at=1.0, estimate_s=50_000.0, user="bob"),
        ),
    )
    assert starts_of(state, now=10.0) == []
    unprotected = Policy(backfill_protected_jobs=0)
    assert [start.job_id for start in starts_of(state, now=10.0, policy=unprotected)] == [2]


@pytest.mark.parametrize(
    ("checkpointable", "estimate_s", "expected"),
    [
        # 3 x 1300 + 60 after node 0 frees at 1000 runs past its booking at 4800: node 0
        # is no use to the head job, so node 1 is held for it and job 2 may take node 0.
        (False, 1300.0, [2]),
        # No estimate: only GPUs with nothing booked ahead would take it (node 1).
        (False, None, [2]),
        # Checkpointable, 1300 s fits before the booking: node 0 is held, job 2 waits.
        (True, 1300.0, []),
    ],
)
def test_the_head_job_is_held_only_gpus_it_could_be_placed_on(checkpointable, estimate_s, expected):
    # Node 0: 7 GPUs busy until ~1000, 1 idle, all 8 booked at 4800. Node 1: busy until ~3000.
    state = snapshot(
        runs=(
            run(8, tuple(range(1, 8)), estimated_end=1000.0),
            run(9, tuple(range(100, 108)), estimated_end=3000.0),
        ),
        reservations=(reservation(1, tuple(range(8)), 4800.0, 8400.0, job_id=77),),
        queued_jobs=(
            job(1, 8, submitted_at=0.0, estimate_s=estimate_s, checkpointable=checkpointable,
                priority=Priority.HIGH),
            job(2, 1, submitted_at=1.0, estimate_s=2500.0, user="bob"),
        ),
    )
    assert [start.job_id for start in starts_of(state, now=10.0)] == expected
    # On the bare estimate (1300 s, or the 3600 s default) node 0 is held every time.
    bare = Policy(grace_s=GRACE_S, min_preemptible_runtime_s=900.0, protect_as_placed=False)
    assert starts_of(state, now=10.0, policy=bare) == []


@pytest.mark.parametrize(("estimate_s", "expected"), [(1000.0, [2]), (10_000.0, [])])
def test_a_job_wider_than_a_node_may_use_nodes_held_for_another_until_the_hold_ends(
    estimate_s, expected
):
    # Nodes 0 and 1 idle, node 2 busy until ~5000: all three are held until then for the
    # 24-GPU job 1. The 16-GPU job 2 may take nodes 0 and 1 if it ends by 5000 (as a job on
    # one node may), not otherwise.
    state = snapshot(
        gpus=gpus(nodes=3),
        runs=(run(9, tuple(range(200, 208)), estimated_end=5000.0),),
        queued_jobs=(
            job(1, 24, submitted_at=0.0, estimate_s=3600.0),
            job(2, 16, submitted_at=1.0, estimate_s=estimate_s),
        ),
    )
    policy = Policy(grace_s=GRACE_S, allow_multi_node=True, priority_preemption=False)
    assert [start.job_id for start in starts_of(state, now=10.0, policy=policy)] == expected
    # Before #15's third round held nodes were closed to such jobs whatever their length.
    bare = Policy(grace_s=GRACE_S, allow_multi_node=True, priority_preemption=False,
                  protect_as_placed=False)
    assert starts_of(state, now=10.0, policy=bare) == []


@pytest.mark.parametrize(("allow", "expected_gpus"), [(False, None), (True, 12)])
def test_jobs_larger_than_a_node_take_whole_nodes_only_when_allowed(allow, expected_gpus):
    state = snapshot(queued_jobs=(job(1, 12),))
    starts = starts_of(state, policy=Policy(allow_multi_node=allow))
    if expected_gpus is None:
        assert starts == []
    else:
        (start,) = starts
        assert start.gpu_ids == (*range(8), *range(100, 104))


def test_drained_and_maintenance_gpus_get_no_new_runs():
    states = {gpu_id: GpuState.DRAINED for gpu_id in range(8)}
    states.update({gpu_id: GpuState.MAINTENANCE for gpu_id in range(100, 107)})
    state = snapshot(gpus=gpus(states=states), queued_jobs=(job(1, 1), job(2, 1, user="bob")))
    starts = starts_of(state)
    assert [start.gpu_ids for start in starts] == [(107,)]


def test_time_limit_caps_must_end_by():
    (start,) = starts_of(snapshot(queued_jobs=(job(1, 1, timeout_s=7200.0),)), now=100.0)
    assert start.must_end_by == 7300.0


def test_a_job_already_running_is_not_started_twice():
    state = snapshot(runs=(run(9, (0,), job_id=1),), queued_jobs=(job(1, 1),))
    assert starts_of(state) == []


def test_examined_jobs_are_bounded():
    # 20 jobs whose time limit is shorter than the grace (they can never start), then one
    # that can: with at most 5 examined per plan it is not reached.
    hopeless = [job(n, 1, submitted_at=float(n), timeout_s=30.0, user=f"u{n}")
                for n in range(20)]
    short = job(99, 1, submitted_at=100.0, user="z")
    state = snapshot(queued_jobs=(*hopeless, short))
    in_submit_order = dict(aging_per_hour=0.0, entry_penalty=0.0)
    assert starts_of(state, policy=Policy(max_jobs_examined=5, **in_submit_order)) == []
    starts = starts_of(state, policy=Policy(max_jobs_examined=100, **in_submit_order))
    assert [start.job_id for start in starts] == [99]


class TestQuota:
    def test_team_without_quota_left_does_not_start(self):
        teams = (TeamAccount("vision", quota_remaining_gpu_s=0.0),)
        assert starts_of(snapshot(queued_jobs=(job(1, 1),), teams=teams)) == []

    def test_over_quota_allowed_by_admin_starts_when_gpus_are_idle(self):
        teams = (TeamAccount("vision", quota_remaining_gpu_s=0.0, over_quota_allowed=True),)
        (start,) = starts_of(snapshot(queued_jobs=(job(1, 1),), teams=teams))
        assert start.must_end_by is None

    def test_must_end_by_stops_the_charge_at_the_quota(self):
        # 3600 GPU-s left at usage factor 0.5 = 2 h on 1 GPU, 1 h on 2 GPUs.
        teams = (TeamAccount("vision", quota_remaining_gpu_s=3600.0),)
        (start,) = starts_of(snapshot(queued_jobs=(job(1, 2, estimate_s=600.0),), teams=teams))
        assert start.must_end_by == 3600.0

    def test_running_runs_and_earlier_starts_in_the_same_plan_use_the_quota_up(self):
        teams = (TeamAccount("vision", quota_remaining_gpu_s=3600.0),)
        running = run(5, (100,), must_end_by=3600.0 + 0.0)  # may still use 1800 GPU-s
        jobs = (job(1, 1, estimate_s=600.0), job(2, 1, estimate_s=600.0, submitted_at=1.0))
        starts = starts_of(snapshot(queued_jobs=jobs, runs=(running,), teams=teams))
        assert [start.job_id for start in starts] == [1]
        assert starts[0].must_end_by == 3600.0

    def test_a_lease_bounds_runs_of_teams_with_a_quota(self):
        teams = (TeamAccount("vision", quota_remaining_gpu_s=10**9),)
        policy = Policy(quota_lease_s=7200.0)
        (start,) = starts_of(
            snapshot(queued_jobs=(job(1, 1, estimate_s=600.0),), teams=teams), policy=policy
        )
        assert start.must_end_by == 7200.0


@pytest.mark.parametrize(("checkpointable", "expected_gpu"), [(True, 0), (False, 1)])
def test_jobs_that_cannot_checkpoint_get_the_widest_margin(checkpointable, expected_gpu):
    state = snapshot(
        gpus=gpus(nodes=1, per_node=2),
        reservations=(reservation(1, (0,), 1000.0, 2000.0, job_id=77),),
        queued_jobs=(job(1, 1, estimate_s=600.0, checkpointable=checkpointable),),
    )
    (start,) = starts_of(state)
    assert start.gpu_ids == (expected_gpu,)
