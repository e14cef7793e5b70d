"""Priority preemption (scheduler.priority_preemption): an urgent or high job that cannot
start stops lower-priority backfill runs — checkpointable first, after a minimum runtime,
never more than needed, never a run inside its own booking, with the urgent limit per team.
Tests at the plan() boundary, plus properties over random snapshots and one simulated
replay where the preempted run cannot checkpoint."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import DEFAULT_POLICY, Priority, Reason, RunKind, Stop, plan
from scheduler.sim.engine import SimJob, Simulation, SimulationConfig
from scheduler.sim.metrics import compute_metrics
from scheduler.sim.policies import policy_for
from scheduler.sim.workload import Workload, make_gpus
from tests.scheduler.builders import apply, gpus, job, of_type, reservation, run, snapshot

NOW = 10_000.0
LONG_AGO = 0.0


def preemption_stops(actions) -> list[Stop]:
    return [
        action for action in of_type(actions, Stop)
        if action.reason == Reason.PRIORITY_PREEMPTION
    ]


def one_full_node(*runs):
    return snapshot(gpus=gpus(nodes=1, per_node=8), runs=tuple(runs))


def test_urgent_job_stops_checkpointable_low_runs_first_and_no_more_than_needed():
    state = replace(
        one_full_node(
            run(1, (0, 1, 2, 3), priority=Priority.LOW, checkpointable=False),
            run(2, (4, 5), priority=Priority.LOW),
            run(3, (6, 7), priority=Priority.LOW),
        ),
        queued_jobs=(job(10, 2, priority=Priority.URGENT, submitted_at=NOW - 60),),
    )
    stops = preemption_stops(plan(state, NOW))
    # Two GPUs needed: one checkpointable 2-GPU run is enough (the older of equal losses
    # goes by least work lost, then id).
    assert [stop.run_id for stop in stops] == [2]
    assert stops[0].grace_s == DEFAULT_POLICY.grace_s
    assert stops[0].kill_at == NOW + DEFAULT_POLICY.grace_s


def test_non_checkpointable_runs_only_when_nothing_else_makes_room():
    state = replace(
        one_full_node(
            run(1, (0, 1, 2, 3), priority=Priority.LOW, checkpointable=False),
            run(2, (4, 5, 6, 7), priority=Priority.LOW),
        ),
        queued_jobs=(job(10, 6, priority=Priority.HIGH),),
    )
    assert sorted(stop.run_id for stop in preemption_stops(plan(state, NOW))) == [1, 2]


def test_minimum_runtime_protects_a_fresh_run():
    fresh = NOW - DEFAULT_POLICY.min_runtime_before_preemption_s + 1
    state = replace(
        one_full_node(run(1, tuple(range(8)), priority=Priority.LOW, started_at=fresh)),
        queued_jobs=(job(10, 1, priority=Priority.URGENT),),
    )
    assert preemption_stops(plan(state, NOW)) == []
    old_enough = replace(state, runs=(replace(state.runs[0], started_at=fresh - 1),))
    assert [stop.run_id for stop in preemption_stops(plan(old_enough, NOW))] == [1]


def test_equal_priority_and_medium_jobs_do_not_preempt():
    state = replace(
        one_full_node(run(1, tuple(range(8)), priority=Priority.HIGH)),
        queued_jobs=(job(10, 1, priority=Priority.HIGH), job(11, 1, priority=Priority.MEDIUM)),
    )
    assert preemption_stops(plan(state, NOW)) == []


def test_a_run_inside_its_own_booking_is_never_preempted():
    slot = reservation(5, tuple(range(8)), LONG_AGO, NOW + 7200, job_id=1005)
    state = replace(
        one_full_node(
            run(1, (0, 1, 2, 3), kind=RunKind.RESERVED, reservation_id=5, job_id=1005,
                priority=Priority.LOW),
        ),
        reservations=(slot,),
        queued_jobs=(job(10, 1, priority=Priority.URGENT),),
    )
    assert preemption_stops(plan(state, NOW)) == []


def test_urgent_limit_per_team_demotes_the_third_urgent_job_to_high():
    policy = DEFAULT_POLICY
    assert policy.urgent_limit_per_team == 2
    state = replace(
        snapshot(gpus=gpus(nodes=1, per_node=4)),
        runs=(
            run(1, (0,), priority=Priority.URGENT),
            run(2, (1,), priority=Priority.URGENT),
            run(3, (2,), priority=Priority.HIGH, team="speech", user="carol"),
            run(4, (3,), priority=Priority.MEDIUM, team="speech", user="carol"),
        ),
        queued_jobs=(job(10, 1, priority=Priority.URGENT),),
    )
    # Urgent beyond the limit counts as high: it may stop the medium run, not the high one.
    assert [stop.run_id for stop in preemption_stops(plan(state, NOW))] == [4]
    other_team = replace(state, queued_jobs=(job(10, 1, priority=Priority.URGENT,
                                                 team="speech", user="carol"),))
    # Within its team's limit, urgent outranks high; the medium run is still cheaper? No:
    # both checkpointable, least work lost first, then id: equal work, run 3 has the lower id.
    assert [stop.run_id for stop in preemption_stops(plan(other_team, NOW))] == [3]


def test_a_second_plan_stops_nothing_more_while_the_first_stops_take_effect():
    state = replace(
        one_full_node(
            run(1, (0, 1, 2, 3), priority=Priority.LOW),
            run(2, (4, 5, 6, 7), priority=Priority.LOW),
        ),
        queued_jobs=(job(10, 4, priority=Priority.URGENT),),
    )
    first = plan(state, NOW)
    assert [stop.run_id for stop in preemption_stops(first)] == [1]
    after = apply(state, first, NOW)
    assert preemption_stops(plan(after, NOW + 5)) == []


def test_preemption_off_in_the_policy():
    state = replace(
        one_full_node(run(1, tuple(range(8)), priority=Priority.LOW)),
        queued_jobs=(job(10, 1, priority=Priority.URGENT),),
    )
    assert preemption_stops(plan(state, NOW, replace(DEFAULT_POLICY, priority_preemption=False))) == []


priorities = st.sampled_from(list(Priority))


@st.composite
def random_cluster(draw):
    nodes = draw(st.integers(1, 3))
    inventory = gpus(nodes=nodes, per_node=4)
    free = [gpu.id for gpu in inventory]
    runs, reservations = [], []
    for number in range(draw(st.integers(0, 8))):
        size = draw(st.sampled_from([1, 1, 2, 4]))
        node = draw(st.integers(0, nodes - 1))
        on_node = [gpu_id for gpu_id in free if gpu_id // 100 == node][:size]
        if len(on_node) < size:
            continue
        for gpu_id in on_node:
            free.remove(gpu_id)
        reserved = draw(st.booleans()) and number % 3 == 0
        reservation_id = None
        if reserved:
            reservation_id = 500 + number
            reservations.append(reservation(
                reservation_id, tuple(on_node), NOW - 3600, NOW + draw(st.integers(600, 9000)),
                job_id=2000 + number,
            ))
        runs.append(run(
            number + 1, tuple(on_node),
            job_id=2000 + number,
            kind=RunKind.RESERVED if reserved else RunKind.BACKFILL,
            reservation_id=reservation_id,
            started_at=NOW - draw(st.integers(0, 7200)),
            priority=draw(priorities),
            checkpointable=draw(st.booleans()),
            stop_requested_at=NOW - 10 if draw(st.integers(0, 9)) == 0 else None,
            team=draw(st.sampled_from(["vision", "speech"])),
        ))
    queued = tuple(
        job(100 + number, draw(st.sampled_from([1, 2, 4])), priority=draw(priorities),
            submitted_at=NOW - draw(st.integers(0, 3600)),
            checkpointable=draw(st.booleans()),
            team=draw(st.sampled_from(["vision", "speech"])))
        for number in range(draw(st.integers(0, 5)))
    )
    return snapshot(gpus=inventory, runs=tuple(runs), reservations=tuple(reservations),
                    queued_jobs=queued)


@settings(max_examples=150, deadline=None)
@given(state=random_cluster())
def test_property_no_booking_run_is_ever_preempted(state):
    runs = {item.id: item for item in state.runs}
    reserved_gpus = {
        gpu_id for item in state.reservations if item.start <= NOW < item.end
        for gpu_id in item.gpu_ids
    }
    best_rank = min(
        ({Priority.URGENT: 0, Priority.HIGH: 1}.get(item.priority, 9) for item in state.queued_jobs),
        default=9,
    )
    rank = {Priority.URGENT: 0, Priority.HIGH: 1, Priority.MEDIUM: 2, Priority.LOW: 3}
    stops = preemption_stops(plan(state, NOW))
    assert len({stop.run_id for stop in stops}) == len(stops)
    for stop in stops:
        victim = runs[stop.run_id]
        assert victim.kind == RunKind.BACKFILL and victim.reservation_id is None
        assert not reserved_gpus.intersection(victim.gpu_ids)
        assert victim.stop_requested_at is None
        assert NOW - victim.started_at >= DEFAULT_POLICY.min_runtime_before_preemption_s
        assert rank[victim.priority] > best_rank
    # Deterministic: the same snapshot with its tuples reversed plans the same stops.
    shuffled = replace(state, runs=state.runs[::-1], queued_jobs=state.queued_jobs[::-1])
    assert preemption_stops(plan(shuffled, NOW)) == stops


def test_simulator_counts_a_preempted_non_checkpointable_run_as_lost_work():
    # One 4-GPU node: a low-priority job that cannot checkpoint runs for an hour, then an
    # urgent job arrives and needs the whole node.
    low = SimJob(id=1, user="ann", team="vision", gpus=4, submit_s=0.0, duration_s=20_000.0,
                 checkpointable=False, priority=Priority.LOW)
    urgent = SimJob(id=2, user="bob", team="vision", gpus=4, submit_s=3600.0,
                    duration_s=600.0, priority=Priority.URGENT)
    policy = policy_for("gpubook")
    gpus_total = make_gpus(4, 4)
    config = SimulationConfig(gpus=gpus_total, policy=policy,
                              team_quota_gpu_s={"vision": 1e12}, record_actions=True)
    result = Simulation(config, [low, urgent], ()).run()
    stopped = [record for record in result.run_records if record.how == "stopped_lost"]
    assert [record.job_id for record in stopped] == [1]
    assert stopped[0].end_s == 3600.0
    assert result.jobs[2].first_start_s < 3600.0 + 2 * policy.grace_s
    assert result.jobs[1].completed_s is not None  # requeued and run again from scratch
    workload = Workload(jobs=(low, urgent), bookings=(), booking_target_gpu_s=0.0,
                        booked_gpu_s=0.0, bookings_shifted=0, bookings_refused=0)
    metrics = compute_metrics(result, workload, policy_name="gpubook", gpus_total=4,
                              window=(0.0, 3600.0), quotas={"vision": 1e12}, wall_s=0.0)
    assert metrics["lost_gpu_hours"] == 4.0  # 4 GPUs x the hour of work thrown away
    assert metrics["preemptions"] == 1
