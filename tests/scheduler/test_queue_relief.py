"""Queue relief (scheduler.queue_relief): once several queued jobs have waited long with no
room, the checkpointable backfill run whose GPUs start the most of them is stopped."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler import DEFAULT_POLICY, Priority, Reason, ReliefHistory, RunKind, Start, Stop, plan
from scheduler.plan import plan_detailed
from scheduler.sim.engine import SimJob, Simulation, SimulationConfig
from scheduler.sim.policies import policy_for
from scheduler.sim.workload import make_gpus
from tests.scheduler.builders import apply, gpus, job, of_type, reservation, run, snapshot

NOW = 100_000.0
HOUR = 3600.0


def relief_stops(actions) -> list[Stop]:
    return [action for action in of_type(actions, Stop) if action.reason == Reason.QUEUE_RELIEF]


def waiting(count: int, *, waited_s: float = 2 * HOUR, first_id: int = 10, gpus_needed: int = 1):
    return tuple(
        job(first_id + number, gpus_needed, submitted_at=NOW - waited_s + number)
        for number in range(count)
    )


def two_full_nodes(*runs, queued=()):
    return snapshot(gpus=gpus(nodes=2, per_node=8), runs=tuple(runs), queued_jobs=tuple(queued))


def test_the_run_whose_gpus_start_the_most_long_waiting_jobs_is_stopped():
    state = two_full_nodes(
        run(1, tuple(range(8)), started_at=NOW - 5000),  # frees 8: starts all five
        run(2, (100, 101), started_at=0.0),  # frees 2: only two, under the minimum of four
        run(3, tuple(range(102, 108)), started_at=0.0, checkpointable=False),
        queued=waiting(5),
    )
    (stop,) = relief_stops(plan(state, NOW))
    assert (stop.run_id, stop.grace_s, stop.kill_at) == (1, 60.0, NOW + 60.0)


def test_equal_counts_go_to_the_run_that_has_held_its_gpus_longest():
    state = two_full_nodes(
        run(1, tuple(range(8)), started_at=NOW - 5000),
        run(2, tuple(range(100, 108)), started_at=NOW - 9000),
        queued=waiting(4),
    )
    assert [stop.run_id for stop in relief_stops(plan(state, NOW))] == [2]


def test_idle_gpus_of_a_node_count_with_the_run_that_would_free_the_rest():
    # Node 0 has 6 idle GPUs, but the waiting jobs need 8 each: node 0's 2-GPU run makes
    # room for one of them with those six (node 1's run cannot checkpoint) — under the
    # minimum of four, so nothing is stopped; with relief_min_jobs=1 that run is the one.
    state = two_full_nodes(
        run(1, (0, 1), started_at=0.0),
        run(2, tuple(range(100, 108)), started_at=0.0, checkpointable=False),
        queued=waiting(4, gpus_needed=8),
    )
    assert relief_stops(plan(state, NOW)) == []
    relieved = plan(state, NOW, replace(DEFAULT_POLICY, relief_min_jobs=1))
    assert [stop.run_id for stop in relief_stops(relieved)] == [1]


def test_too_few_long_waiting_jobs_stop_nothing_and_plan_wakes_when_enough_have_waited():
    young = job(20, 1, submitted_at=NOW - 700)
    state = two_full_nodes(
        run(1, tuple(range(8)), started_at=0.0),
        run(2, tuple(range(100, 108)), started_at=0.0),
        queued=(*waiting(3), young),
    )
    result = plan_detailed(state, NOW)
    assert relief_stops(result.actions) == []
    # The fourth job's hour is up at NOW + 2,900 s; plan wakes at the next 10-minute mark.
    assert (NOW - 700 + HOUR, result.next_wakeup) == (102_900.0, 103_200.0)
    assert relief_stops(plan(state, NOW - 701 + HOUR)) == []
    # A plan held for another reason sees the hour as soon as it is up.
    assert [stop.run_id for stop in relief_stops(plan(state, NOW - 700 + HOUR))] == [1]
    assert [stop.run_id for stop in relief_stops(plan(state, result.next_wakeup))] == [1]


def test_a_plan_that_starts_a_job_stops_nothing_for_relief():
    # GPU 107 is idle: the oldest job starts there; the five left are relieved a plan later.
    state = two_full_nodes(
        run(1, tuple(range(8)), started_at=0.0),
        run(2, tuple(range(100, 107)), started_at=0.0, checkpointable=False),
        queued=waiting(6),
    )
    first = plan(state, NOW)
    assert [start.job_id for start in of_type(first, Start)] == [10]
    assert relief_stops(first) == []
    after = plan(apply(state, first, NOW), NOW + 10)
    assert of_type(after, Start) == []
    assert [stop.run_id for stop in relief_stops(after)] == [1]


# Runs neither relief nor the queue drain may stop (test_queue_drain uses them too).
MAY_NOT_GIVE_WAY = [
    pytest.param(dict(checkpointable=False), id="cannot-checkpoint"),
    pytest.param(dict(priority=Priority.HIGH), id="high"),
    pytest.param(dict(times_preempted=1), id="preempted-before"),
    pytest.param(dict(kind=RunKind.RESERVED, reservation_id=7), id="in-its-booking"),
    pytest.param(dict(started_at=NOW - 300), id="too-young"),
]


@pytest.mark.parametrize("victim", MAY_NOT_GIVE_WAY)
def test_runs_that_may_not_be_stopped_are_left_alone(victim):
    state = snapshot(gpus=gpus(nodes=1, per_node=8),
                     runs=(run(1, tuple(range(8)), **{"started_at": 0.0, **victim}),),
                     queued_jobs=waiting(8))
    if victim.get("reservation_id"):
        state = replace(state, reservations=(
            reservation(7, tuple(range(8)), NOW - HOUR, NOW + HOUR, job_id=1001),
        ))
    result = plan_detailed(state, NOW)
    assert relief_stops(result.actions) == []
    if "started_at" in victim:  # the 10-minute mark after the run has had its 15 minutes
        assert (NOW - 300 + 900, result.next_wakeup) == (100_600.0, 100_800.0)


def test_gpus_a_booking_takes_soon_are_no_room():
    state = replace(
        snapshot(gpus=gpus(nodes=1, per_node=8), runs=(run(1, tuple(range(8)), started_at=0.0),),
                 queued_jobs=waiting(8)),
        reservations=(reservation(7, (0,), NOW + 600, NOW + HOUR),),
    )
    assert relief_stops(plan(state, NOW)) == []


def test_one_relief_at_a_time():
    state = two_full_nodes(
        run(1, tuple(range(8)), started_at=0.0),
        run(2, tuple(range(100, 108)), started_at=0.0),
        queued=waiting(16),
    )
    first = plan(state, NOW)
    assert len(relief_stops(first)) == 1
    # While that stop takes effect, the next plans stop nothing more.
    assert relief_stops(plan(apply(state, first, NOW), NOW + 10)) == []


def test_the_budget_spent_stops_nothing_until_enough_stops_leave_its_window():
    # 99 jobs submitted this week allow floor(0.99) + 2 = 2 stops; two were made, the older
    # five days ago: relief waits until it is a week old.
    week = DEFAULT_POLICY.relief_budget_window_s
    spent = ReliefHistory(stops=(NOW - 2 * HOUR, NOW - 5 * 86_400.0), jobs_submitted=99)
    state = replace(
        snapshot(gpus=gpus(nodes=1, per_node=8), runs=(run(1, tuple(range(8)), started_at=0.0),),
                 queued_jobs=waiting(8)),
        relief_history=spent,
    )
    result = plan_detailed(state, NOW)
    assert relief_stops(result.actions) == []
    assert result.next_wakeup == NOW - 5 * 86_400.0 + week
    # What reconcile reads a week after that stop no longer holds it.
    left = replace(state, relief_history=replace(spent, stops=spent.stops[:1]))
    assert [stop.run_id for stop in relief_stops(plan(left, result.next_wakeup))] == [1]
    # A hundredth job submitted in the week makes room for a third stop at once.
    more = replace(state, relief_history=replace(spent, jobs_submitted=100))
    assert [stop.run_id for stop in relief_stops(plan(more, NOW))] == [1]
    # With neither a share nor extra stops, relief never acts (and never asks to wake).
    none = replace(DEFAULT_POLICY, relief_budget_share=0.0, relief_budget_extra=0)
    empty = replace(state, relief_history=ReliefHistory())
    assert plan_detailed(empty, NOW, none).actions == ()
    assert plan_detailed(empty, NOW, none).next_wakeup is None


def test_off_in_the_policy():
    state = snapshot(gpus=gpus(nodes=1, per_node=8), runs=(run(1, tuple(range(8)), started_at=0.0),),
                     queued_jobs=waiting(8))
    off = replace(DEFAULT_POLICY, relief_after_s=float("inf"))
    assert relief_stops(plan(state, NOW, off)) == []
    assert relief_stops(plan(state, NOW)) != []


def test_a_burst_on_a_full_node_stops_the_long_run_once_and_it_resumes_after():
    """Through the simulator, plan's real caller: a checkpointable 8-GPU day-long run holds
    the node; four 1-GPU jobs arrive. After an hour they start, the run checkpoints once,
    resumes when they are done and finishes."""
    def jobs() -> list[SimJob]:  # fresh for each replay: the simulator updates them
        return [SimJob(id=1, user="ann", team="vision", gpus=8, submit_s=0.0, duration_s=86_400.0),
                *(SimJob(id=10 + n, user="bob", team="vision", gpus=1, submit_s=600.0,
                         duration_s=1800.0) for n in range(4))]

    burst = jobs()[1:]
    config = SimulationConfig(gpus=make_gpus(8, 8), policy=policy_for("gpubook"),
                              team_quota_gpu_s={"vision": 1e12}, restart_overhead_s=60.0)
    result = Simulation(config, jobs(), ()).run()
    (stopped,) = [record for record in result.run_records if record.job_id == 1 and record.how != "completed"]
    # Stopped when the burst's hour is up; it leaves once its checkpoint is saved (in grace).
    assert stopped.how == "checkpointed" and 600.0 + HOUR < stopped.end_s <= 600.0 + HOUR + 60.0
    assert {result.jobs[job.id].first_start_s for job in burst} == {stopped.end_s}
    assert result.jobs[1].completed_s is not None
    # The baseline policies never relieve: the burst waits for the day-long run.
    fifo = Simulation(
        SimulationConfig(gpus=make_gpus(8, 8), policy=policy_for("fifo"),
                         team_quota_gpu_s={"vision": 1e12}),
        jobs(), (),
    ).run()
    assert {fifo.jobs[job.id].first_start_s for job in burst} == {86_400.0}


def test_in_a_replay_relief_stops_no_more_than_its_budget():
    """Through the simulator: four nodes each held by a day-long 8-GPU run; a burst of four
    1-GPU jobs every three hours. Each burst would have one long run relieved (each job at most
    once: four stops); 20 jobs submitted allow floor(0.2) + 2 = 2 stops, so the last two bursts
    wait for a run to end."""
    def jobs() -> list[SimJob]:
        long_runs = [SimJob(id=n, user="ann", team="vision", gpus=8, submit_s=0.0, duration_s=86_400.0)
                     for n in range(1, 5)]
        bursts = [SimJob(id=10 + 4 * wave + n, user="bob", team="vision", gpus=1,
                         submit_s=600.0 + wave * 3 * HOUR, duration_s=1800.0)
                  for wave in range(4) for n in range(4)]
        return [*long_runs, *bursts]

    def relieved(policy) -> list[int]:
        config = SimulationConfig(gpus=make_gpus(32, 8), policy=policy,
                                  team_quota_gpu_s={"vision": 1e12}, restart_overhead_s=60.0)
        result = Simulation(config, jobs(), ()).run()
        assert all(job.completed_s is not None for job in result.jobs.values())
        return [record.job_id for record in result.run_records if record.how == "checkpointed"]

    assert len(relieved(policy_for("gpubook"))) == 2
    # The negative control: a budget that does not bind lets each burst stop a long run.
    unbounded = replace(policy_for("gpubook"), relief_budget_extra=100)
    assert sorted(relieved(unbounded)) == [1, 2, 3, 4]
