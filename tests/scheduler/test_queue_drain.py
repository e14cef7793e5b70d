"""Queue drain (scheduler.queue_drain): once the oldest job that needs a whole node has waited
an hour, the fewest stoppable runs on one node are stopped for it, and the node is kept for it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler import DEFAULT_POLICY, Drain, Reason, ReliefHistory, Start, Stop, plan
from scheduler.plan import plan_detailed
from scheduler.queue_estimates import estimate_starts
from scheduler.sim.engine import SimJob, Simulation, SimulationConfig
from scheduler.sim.policies import policy_for
from scheduler.sim.workload import make_gpus
from tests.scheduler.builders import gpus, job, of_type, reservation, run, snapshot
from tests.scheduler.test_queue_relief import MAY_NOT_GIVE_WAY

NOW = 100_000.0
HOUR = 3600.0
NODE_0 = tuple(range(8))
NODE_1 = tuple(range(100, 108))
# 1,000 jobs submitted this week: relief's budget is floor(10) + 2 = 12 stops, 8 of them the
# drain's (it leaves relief 4).
WEEK = ReliefHistory(stops=(), jobs_submitted=1000)


def drain_stops(actions) -> list[Stop]:
    return [action for action in of_type(actions, Stop) if action.reason == Reason.QUEUE_DRAIN]


def two_busy_nodes(*queued, **changes):
    """Node 0: four 2-GPU runs. Node 1: one 7-GPU run and an idle GPU (the node that needs
    the fewest stops). Every run is old and may give way."""
    state = snapshot(
        gpus=gpus(nodes=2, per_node=8),
        runs=(
            *(run(n + 1, NODE_0[2 * n:2 * n + 2], started_at=0.0) for n in range(4)),
            run(5, NODE_1[:7], started_at=0.0),
        ),
        queued_jobs=tuple(queued),
        relief_history=WEEK,
    )
    return replace(state, **changes)


def test_the_oldest_whole_node_job_gets_the_node_that_needs_the_fewest_stops():
    wide = job(10, 8, submitted_at=NOW - 2 * HOUR)
    queued = (
        job(9, 8, submitted_at=NOW - 3 * HOUR, times_preempted=1),  # older, but a requeued run
        job(8, 4, submitted_at=NOW - 4 * HOUR),  # older, but fits beside others
        wide,
        job(11, 8, submitted_at=NOW - 90 * 60),  # younger
    )
    (stop,) = drain_stops(plan(two_busy_nodes(*queued), NOW))
    assert (stop.run_id, stop.for_job_id, stop.grace_s, stop.kill_at) == (5, 10, 60.0, NOW + 60.0)


def test_on_a_node_the_widest_runs_go_first():
    state = snapshot(
        gpus=gpus(nodes=1, per_node=8),
        runs=(run(1, (0, 1), started_at=0.0), run(2, (2, 3, 4, 5, 6), started_at=0.0),
              run(3, (7,), started_at=0.0)),
        queued_jobs=(job(10, 8, submitted_at=NOW - 2 * HOUR),), relief_history=WEEK,
    )
    assert sorted(stop.run_id for stop in drain_stops(plan(state, NOW))) == [1, 2, 3]
    # With a GPU idle the same node needs two stops: the 5-GPU and 2-GPU runs, not the 1-GPU.
    fewer = replace(state, runs=state.runs[:2])
    assert sorted(stop.run_id for stop in drain_stops(plan(fewer, NOW))) == [1, 2]


def test_not_before_the_hour_and_plan_wakes_when_it_is_up():
    state = two_busy_nodes(job(10, 8, submitted_at=NOW - 2_700.0))
    result = plan_detailed(state, NOW)
    assert drain_stops(result.actions) == []
    # The hour is up at NOW + 900 s; plan wakes at the next mark of relief's 10-minute grid.
    assert result.next_wakeup == 101_400.0
    assert drain_stops(plan(state, NOW + 899.0)) == []
    assert [stop.run_id for stop in drain_stops(plan(state, NOW + 900.0))] == [5]
    off = replace(DEFAULT_POLICY, drain_after_s=float("inf"))
    assert drain_stops(plan(state, NOW + 900.0, off)) == []


@pytest.mark.parametrize("victim", MAY_NOT_GIVE_WAY)
def test_runs_that_may_not_give_way_are_left_alone(victim):
    state = snapshot(
        gpus=gpus(nodes=1, per_node=8),
        runs=(run(1, NODE_0, **{"started_at": 0.0, **victim}),),
        queued_jobs=(job(10, 8, submitted_at=NOW - 2 * HOUR),), relief_history=WEEK,
    )
    if victim.get("reservation_id"):
        state = replace(state, reservations=(
            reservation(7, NODE_0, NOW - HOUR, NOW + HOUR, job_id=1001),
        ))
    assert drain_stops(plan(state, NOW)) == []


def test_a_run_across_two_nodes_or_a_booking_soon_is_no_room():
    across = snapshot(
        gpus=gpus(nodes=2, per_node=8),
        runs=(run(1, (*NODE_0[4:], *NODE_1[:4]), started_at=0.0),
              run(2, NODE_0[:4], started_at=0.0, checkpointable=False),
              run(3, NODE_1[4:], started_at=0.0, checkpointable=False)),
        queued_jobs=(job(10, 8, submitted_at=NOW - 2 * HOUR),), relief_history=WEEK,
    )
    assert drain_stops(plan(across, NOW)) == []
    booked = replace(
        two_busy_nodes(job(10, 8, submitted_at=NOW - 2 * HOUR)),
        reservations=(reservation(7, (100,), NOW + 600, NOW + HOUR),),
    )
    # Node 1 is booked soon on the run's GPU: node 0's four runs go instead.
    assert sorted(stop.run_id for stop in drain_stops(plan(booked, NOW))) == [1, 2, 3, 4]


def test_one_at_a_time_and_within_the_budget_relief_leaves():
    state = two_busy_nodes(job(10, 8, submitted_at=NOW - 2 * HOUR))
    pending = replace(state, runs=(*state.runs[:4], replace(state.runs[4], stop_requested_at=NOW - 5)))
    assert drain_stops(plan(pending, NOW)) == []
    # 300 jobs allow floor(3) + 2 = 5 stops; the drain leaves relief 4 of them: one is left.
    history = ReliefHistory(stops=(), jobs_submitted=300)
    assert drain_stops(plan(replace(state, relief_history=ReliefHistory()), NOW)) == []
    assert len(drain_stops(plan(replace(state, relief_history=history), NOW))) == 1
    spent = replace(history, stops=(NOW - HOUR,))
    assert drain_stops(plan(replace(state, relief_history=spent), NOW)) == []
    # Node 0 needs four stops: over a budget of one, so nothing is sent rather than part.
    node_0_only = replace(state, runs=(*state.runs[:4], replace(state.runs[4], checkpointable=False)))
    assert drain_stops(plan(replace(node_0_only, relief_history=history), NOW)) == []


def test_the_drained_node_is_kept_for_its_job_and_it_starts_there_first():
    wide = job(10, 8, submitted_at=NOW - 2 * HOUR)
    small = job(11, 1, submitted_at=NOW - 3 * HOUR)  # ranks first in the queue
    drain = Drain(at=NOW - 120, job_id=10, gpu_ids=NODE_1[:7])
    # Node 1 has emptied; node 0 has one GPU idle. The wide job takes node 1, the small job
    # node 0's idle GPU.
    state = snapshot(
        gpus=gpus(nodes=2, per_node=8),
        runs=(run(1, NODE_0[:7], started_at=0.0, checkpointable=False),),
        queued_jobs=(small, wide), drains=(drain,), relief_history=WEEK,
    )
    starts = {start.job_id: start.gpu_ids for start in of_type(plan(state, NOW), Start)}
    assert starts == {10: NODE_1, 11: (7,)}
    # A run on node 1 is still there: the wide job cannot start, and nobody else may take node
    # 1's free GPUs (the small job has no room on node 0 either).
    busy_0 = replace(state, runs=(run(1, NODE_0, started_at=0.0, checkpointable=False),
                                  run(2, (107,), started_at=0.0)))
    result = plan_detailed(busy_0, NOW)
    assert of_type(result.actions, Start) == []
    # Not drained again while the node is kept; plan wakes when the keeping ends.
    assert drain_stops(result.actions) == [] and result.next_wakeup <= NOW - 120 + 900
    # After the 15 minutes the node is open to others again.
    later = plan(busy_0, NOW - 120 + 900 + 1)
    assert [start.job_id for start in of_type(later, Start)] == [11]


def test_the_kept_node_takes_its_job_only_as_placement_would():
    # A job that cannot checkpoint and has no estimate goes only where nothing is booked
    # ahead (`place`'s rule): a booking on the drained node in ten hours keeps it off.
    blind = job(10, 8, submitted_at=NOW - 2 * HOUR, checkpointable=False, estimate_s=None)
    state = snapshot(
        gpus=gpus(nodes=1, per_node=8), queued_jobs=(blind,), relief_history=WEEK,
        drains=(Drain(at=NOW - 120, job_id=10, gpu_ids=NODE_0),),
    )
    assert [start.gpu_ids for start in of_type(plan(state, NOW), Start)] == [NODE_0]
    booked = replace(state, reservations=(reservation(7, (3,), NOW + 10 * HOUR, NOW + 11 * HOUR),))
    assert of_type(plan(booked, NOW), Start) == []


def test_through_the_simulator_a_wide_job_gets_a_node_and_the_stopped_runs_resume():
    """plan's real caller: two nodes, each held by two day-long 4-GPU runs; an 8-GPU job
    arrives. An hour later (on the 10-minute grid) one node's two runs checkpoint, the job
    starts there as soon as they have left, and both runs resume and finish."""
    def jobs() -> list[SimJob]:  # fresh for each replay: the simulator updates them
        return [*(SimJob(id=n, user="ann", team="vision", gpus=4, submit_s=0.0, duration_s=86_400.0)
                  for n in range(1, 5)),
                SimJob(id=10, user="bob", team="vision", gpus=8, submit_s=600.0, duration_s=1800.0)]

    def replay(policy):
        config = SimulationConfig(gpus=make_gpus(16, 8), policy=policy,
                                  team_quota_gpu_s={"vision": 1e12}, restart_overhead_s=60.0)
        return Simulation(config, jobs(), ()).run()

    result = replay(replace(policy_for("gpubook"), relief_budget_extra=100))
    stopped = [record for record in result.run_records if record.how == "checkpointed"]
    assert sorted(record.job_id for record in stopped) == [1, 2]
    assert all(600.0 + HOUR <= record.end_s <= 600.0 + HOUR + 600.0 + 60.0 for record in stopped)
    assert result.jobs[10].first_start_s == max(record.end_s for record in stopped)
    assert all(job.completed_s is not None for job in result.jobs.values())
    # The negative control: without the drain the wide job waits for the day-long runs.
    off = replay(replace(policy_for("gpubook"), relief_budget_extra=100, drain_after_s=float("inf")))
    assert off.jobs[10].first_start_s == 86_400.0


def test_the_queue_estimate_made_at_submission_foresees_the_drain():
    """The queue page's estimate (`estimate_starts`) rolls plan() forward with the drain: in
    the replay above, with exact runtimes, the estimate made when the wide job is submitted
    is the drain's stop plus the grace the runs may use (they leave sooner), not the day-long
    runs' end. The budget here is the jobs submitted so far, so the estimate must plan with
    the snapshot's relief history to foresee the drain."""
    jobs = [*(SimJob(id=n, user="ann", team="vision", gpus=4, submit_s=0.0, duration_s=86_400.0)
              for n in range(1, 5)),
            SimJob(id=10, user="bob", team="vision", gpus=8, submit_s=600.0, duration_s=1800.0)]
    for sim_job in jobs:
        sim_job.estimate_s = sim_job.duration_s
    policy = replace(policy_for("gpubook"), relief_budget_share=1.0, relief_budget_extra=0,
                     drain_leaves_relief=0)
    seen = {}

    def observe(now_s, state):
        if not seen and any(queued.id == 10 for queued in state.queued_jobs):
            seen.update(estimate_starts(state, now_s, policy))

    config = SimulationConfig(gpus=make_gpus(16, 8), policy=policy, use_estimator=False,
                              team_quota_gpu_s={"vision": 1e12}, observer=observe)
    result = Simulation(config, jobs, ()).run()
    assert seen[10].estimated_start == 600.0 + HOUR + 60.0
    assert 600.0 + HOUR < result.jobs[10].first_start_s <= seen[10].estimated_start
