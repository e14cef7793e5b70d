"""`wait_no_room_share`: how much of the queued jobs' waiting no placement could have
avoided without stopping a run (the whole cluster had fewer idle GPUs than the job needs);
`requeue_wait_*`: the waiting of stopped jobs for their next start, which `wait_*` leaves out."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.sim.engine import RunRecord, SimJob, Simulation, SimulationConfig
from scheduler.sim.metrics import compute_metrics, no_room_share, requeue_waits
from scheduler.sim.policies import policy_for
from scheduler.sim.workload import Workload, make_gpus
from scheduler.snapshot import RunKind


def _record(run_id: int, gpus: int, start_s: float, end_s: float) -> RunRecord:
    return RunRecord(run_id=run_id, job_id=run_id, kind=RunKind.BACKFILL, gpus=gpus,
                     start_s=start_s, end_s=end_s, overhead_s=0.0,
                     useful_s=end_s - start_s, how="completed")


def test_the_share_follows_the_busy_gpus_over_each_wait():
    # 8 GPUs: all busy for [0, 100), then 4 busy until 300.
    records = [_record(1, 8, 0.0, 100.0), _record(2, 4, 100.0, 300.0)]
    # One GPU needed, waiting [50, 150): no room for 50 s, room (4 idle) for 50 s.
    assert no_room_share(records, [(50.0, 150.0, 1)], 8) == pytest.approx(0.5)
    # Six GPUs needed, waiting [50, 250): never 6 idle.
    assert no_room_share(records, [(50.0, 250.0, 6)], 8) == pytest.approx(1.0)
    # Both: (50 + 200) of (100 + 200) seconds.
    assert no_room_share(records, [(50.0, 150.0, 1), (50.0, 250.0, 6)], 8) == pytest.approx(
        250.0 / 300.0
    )
    # After every run has ended the cluster has room; no waiting at all is a share of 0.
    assert no_room_share(records, [(400.0, 500.0, 8)], 8) == 0.0
    assert no_room_share(records, [(10.0, 10.0, 1)], 8) == 0.0


def _replay(jobs: list[SimJob], gpus_total: int, gpus_per_node: int) -> dict:
    policy = policy_for("gpubook")
    config = SimulationConfig(gpus=make_gpus(gpus_total, gpus_per_node), policy=policy,
                              team_quota_gpu_s={"vision": 1e12})
    result = Simulation(config, jobs, ()).run()
    workload = Workload(jobs=tuple(jobs), bookings=(), booking_target_gpu_s=0.0,
                        booked_gpu_s=0.0, bookings_shifted=0, bookings_refused=0)
    return compute_metrics(result, workload, policy_name="gpubook", gpus_total=gpus_total,
                           window=(0.0, 3600.0), quotas={"vision": 1e12}, wall_s=0.0)


def _job(number: int, gpus: int, submit_s: float, duration_s: float) -> SimJob:
    return SimJob(id=number, user="ann", team="vision", gpus=gpus, submit_s=submit_s,
                  duration_s=duration_s)


def test_a_full_cluster_is_waiting_with_no_room():
    # One 4-GPU node, all of it busy for 1,000 s: the 1-GPU job waits 990 s with no room.
    metrics = _replay([_job(1, 4, 0.0, 1000.0), _job(2, 1, 10.0, 100.0)], 4, 4)
    assert metrics["wait_mean_s"] == pytest.approx(990.0 / 2)
    assert metrics["wait_no_room_share"] == pytest.approx(1.0)


def test_gpus_spread_over_nodes_are_room_a_placement_could_have_used():
    # Two 4-GPU nodes; 3-GPU runs on each (best fit puts the second on node 1) leave one
    # GPU idle per node: two idle GPUs, but not on one node, so the 2-GPU job waits until
    # the first run ends, all of it with room in the cluster.
    metrics = _replay(
        [_job(1, 3, 0.0, 1000.0), _job(2, 3, 1.0, 2000.0), _job(3, 2, 2.0, 100.0)], 8, 4
    )
    assert metrics["wait_mean_s"] == pytest.approx(998.0 / 3)
    assert metrics["wait_no_room_share"] == 0.0


def test_requeue_waits_sum_each_jobs_gaps_between_its_runs():
    def run_of(job_id: int, run_id: int, start_s: float, end_s: float) -> RunRecord:
        return replace(_record(run_id, 1, start_s, end_s), job_id=job_id)

    # Job 7 ran three times (listed out of order), job 8 once.
    runs = [run_of(7, 1, 0.0, 100.0), run_of(7, 5, 900.0, 950.0), run_of(8, 3, 50.0, 60.0),
            run_of(7, 2, 400.0, 500.0)]
    # Job 7: (400 - 100) + (900 - 500); a job run once does not appear, a skipped one neither.
    assert requeue_waits(runs, set()) == {7: 700.0}
    assert requeue_waits(runs, {7}) == {}


def test_a_job_stopped_for_others_waits_again_and_that_is_counted_apart():
    """Through the simulator: queue relief stops the day-long 8-GPU run for four 1-GPU jobs
    that waited an hour; it is queued again until they end (30 min). Its first wait was 0, so
    `wait_mean_s` sees only the burst's hour; the half hour it waits again is the requeue wait."""
    jobs = [SimJob(id=1, user="ann", team="vision", gpus=8, submit_s=0.0, duration_s=86_400.0),
            *(SimJob(id=10 + n, user="bob", team="vision", gpus=1, submit_s=600.0,
                     duration_s=1800.0) for n in range(4))]
    metrics = _replay(jobs, 8, 8)
    assert metrics["requeue_wait_max_s"] == pytest.approx(1800.0, abs=120.0)
    assert metrics["requeue_wait_mean_s"] == pytest.approx(metrics["requeue_wait_max_s"] / 5)
    # The burst's first waits (about an hour each) are all `wait_mean_s` holds.
    assert metrics["wait_mean_s"] == pytest.approx(4 * 3600.0 / 5, abs=120.0)
