"""How good are the scheduler's estimates? Two measurements on `../shared/traces/`:

1. **Runtime prediction** (issue #18 item 4, `scheduler.estimate.predict_runtime`): every
   job of each whole trace, in submit order, predicted from its owner's runs that had
   *finished* by its submission (the traces carry no image/model/dataset, so "similar" is
   the size class); no user estimate exists in a trace, so the fallback is the default
   (1 h). Error as the factor max(predicted/actual, actual/predicted): median and p90,
   overall and per source; and the median of predicted/actual (bias).
2. **Queue start estimates** (issue #18 item 2, `scheduler.queue_estimates.estimate_starts`):
   the philly evaluation window (benchmarks/eval_matrix.py, 0.95 load, 20 % booked, seed 1)
   replayed under gpubook; every 10th submitted job gets the estimate `estimate_starts`
   gives at the first plan after its submission, compared with the start it actually got:
   median and p90 absolute error, for all sampled jobs and for those that waited.

3. **Cost of one estimate** (what each stored refresh, and each preview on the submit form,
   pays): `estimate_starts` over the whole queue on `benchmarks/scheduler_plan.py`'s snapshots
   (small: 64 GPUs, 200 queued, 100 bookings; base: 1,024 GPUs, 5,000 queued, 2,000
   bookings), against one `plan()` on the same snapshot (the baseline: the estimate is many),
   with the earlier budget (500 plans) and the current one (`MAX_PLANS`), back to back; and
   the preview's roll-forward `until_started` for the 10th job of the queue and the middle
   one (a job with no start within the budget costs the whole roll-forward).

4. **Coarse steps against exact** (`--only coarse`): the default estimate at the base scale
   against the exact roll-forward (one plan per event, no budget), by the exact wait.

    .venv/bin/python benchmarks/scheduler_estimates.py [--only runtime|queue|cost|coarse]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.eval_matrix import TRACES_DIR  # noqa: E402
from scheduler.estimate import PastRun, RuntimeSource, predict_runtime, size_class  # noqa: E402
from scheduler.policy import Policy  # noqa: E402
from scheduler.sim.metrics import percentile  # noqa: E402
from scheduler.sim.trace import parse_window, read_trace  # noqa: E402

TRACES = ("philly.csv", "helios_venus.csv", "itp_cluster04.csv")


def runtime_prediction(trace_file: str) -> dict:
    trace = read_trace(TRACES_DIR / trace_file, parse_window(None))
    default_s = Policy().default_estimate_s
    ends = sorted((job.submit_s + job.duration_s, job.job_id, job) for job in trace)
    finished = 0
    # Per user and size class, the runs finished so far (the estimator reads the last two).
    recent: dict[tuple[str, int], list[PastRun]] = {}
    factors: dict[str, list[float]] = {source.value: [] for source in RuntimeSource}
    ratios: list[float] = []
    for job in trace:
        while finished < len(ends) and ends[finished][0] <= job.submit_s:
            end_s, _, done = ends[finished]
            finished += 1
            if done.user.startswith("job-"):
                continue  # no user in the trace (ITP): nobody's history
            runs = recent.setdefault((done.user, size_class(done.gpus)), [])
            runs.append(PastRun(done.user, done.gpus, done.duration_s, end_s, done.job_id))
            del runs[:-2]
        estimate = predict_runtime(
            recent.get((job.user, size_class(job.gpus)), ()),
            user=job.user, gpus=job.gpus, default_s=default_s,
        )
        ratio = estimate.seconds / job.duration_s
        ratios.append(ratio)
        factors[estimate.source.value].append(max(ratio, 1 / ratio))
    every = [factor for values in factors.values() for factor in values]
    return {
        "jobs": len(trace),
        "median_factor": percentile(every, 0.5),
        "p90_factor": percentile(every, 0.9),
        "median_ratio": percentile(ratios, 0.5),
        "by_source": {
            source: {
                "jobs": len(values),
                "median_factor": percentile(values, 0.5),
                "p90_factor": percentile(values, 0.9),
            }
            for source, values in factors.items() if values
        },
    }


def print_runtime() -> None:
    print("| trace | jobs | median error factor | p90 error factor | median predicted/actual "
          "| history: jobs, median, p90 | default: jobs, median, p90 |")
    print("|---|---|---|---|---|---|---|")
    for trace_file in TRACES:
        result = runtime_prediction(trace_file)
        cells = []
        for source in ("history", "default"):
            part = result["by_source"].get(source)
            cells.append(
                f"{part['jobs']:,}, {part['median_factor']:.2f}x, {part['p90_factor']:.1f}x"
                if part else "0"
            )
        print(f"| {trace_file} | {result['jobs']:,} | {result['median_factor']:.2f}x | "
              f"{result['p90_factor']:.1f}x | {result['median_ratio']:.2f} | "
              f"{cells[0]} | {cells[1]} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["runtime", "queue", "cost", "coarse"])
    arguments = parser.parse_args()
    if not TRACES_DIR.exists():
        print(f"traces not found: {TRACES_DIR}", file=sys.stderr)
        return 1
    started = time.perf_counter()
    if arguments.only in (None, "runtime"):
        print_runtime()
    if arguments.only in (None, "queue"):
        print_queue()
    if arguments.only in (None, "cost"):
        print_cost()
    if arguments.only in (None, "coarse"):
        print_coarse_error()
    print(f"\n({time.perf_counter() - started:.0f} s)")
    return 0


QUEUE_SAMPLE_EVERY = 5
QUEUE_MAX_PLANS = 200


def queue_estimate_error() -> dict:
    from benchmarks.eval_matrix import GPUS_PER_NODE, WINDOWS, cluster_size, offered_gpus
    from scheduler.queue_estimates import estimate_starts
    from scheduler.sim.engine import Simulation, SimulationConfig
    from scheduler.sim.policies import policy_for
    from scheduler.sim.replay import fresh_jobs, team_quotas
    from scheduler.sim.workload import build_workload, make_gpus

    setup = WINDOWS[0]
    trace = read_trace(TRACES_DIR / setup.file, setup.window)
    offered = offered_gpus(trace, setup.window)
    gpus_total = cluster_size(offered, 0.95)
    gpus = make_gpus(gpus_total, GPUS_PER_NODE)
    workload = build_workload(trace, gpus=gpus, gpus_per_node=GPUS_PER_NODE,
                              reservation_share=0.2, slot_s=1800.0, grace_s=60.0, seed=1)
    policy = policy_for("gpubook")
    booked = {booking.job_id for booking in workload.bookings}
    sampled = {job.id for job in workload.jobs if job.id not in booked}
    sampled = set(sorted(sampled)[::QUEUE_SAMPLE_EVERY])
    estimated: dict[int, float | None] = {}

    def observe(now_s: float, snapshot) -> None:
        new = [job.id for job in snapshot.queued_jobs
               if job.id in sampled and job.id not in estimated]
        if not new:
            return
        estimates = estimate_starts(snapshot, now_s, policy, max_plans=QUEUE_MAX_PLANS)
        for job_id in new:
            estimated[job_id] = estimates[job_id].estimated_start

    config = SimulationConfig(
        gpus=gpus, policy=policy, restart_overhead_s=60.0,
        team_quota_gpu_s=team_quotas(workload, policy, offered / gpus_total),
        run_aware_booking=True, observer=observe,
    )
    result = Simulation(config, fresh_jobs(workload, without_bookings=False),
                        workload.bookings).run()
    errors, waited_errors, no_estimate = [], [], 0
    for job_id, start_s in estimated.items():
        job = result.jobs[job_id]
        if start_s is None or job.first_start_s is None:
            no_estimate += 1
            continue
        error = abs(start_s - job.first_start_s)
        errors.append(error)
        if job.first_start_s > job.submit_s + 1:
            waited_errors.append(error)
    return {
        "gpus": gpus_total, "sampled": len(estimated), "no_estimate": no_estimate,
        "median_abs_error_s": percentile(errors, 0.5), "p90_abs_error_s": percentile(errors, 0.9),
        "waited": len(waited_errors),
        "waited_median_abs_error_s": percentile(waited_errors, 0.5),
        "waited_p90_abs_error_s": percentile(waited_errors, 0.9),
    }


def print_queue() -> None:
    result = queue_estimate_error()
    print(f"\nqueue estimates, philly window on {result['gpus']} GPUs, 20 % booked, gpubook: "
          f"{result['sampled']} sampled jobs ({result['no_estimate']} without an estimate "
          f"within {QUEUE_MAX_PLANS} plans): median abs error "
          f"{result['median_abs_error_s']:,.0f} s, p90 {result['p90_abs_error_s']:,.0f} s; "
          f"the {result['waited']} that waited: median {result['waited_median_abs_error_s']:,.0f}"
          f" s, p90 {result['waited_p90_abs_error_s']:,.0f} s")



def print_cost() -> None:
    import os

    from benchmarks.scheduler_plan import NOW, build_snapshot
    from scheduler import plan
    from scheduler.queue_estimates import PLAN_BUDGET, estimate_starts, queue_positions

    print(f"\nload average {os.getloadavg()[0]:.1f}; before = {BEFORE_MAX_PLANS} plans, no "
          f"budget (the earlier default); after = the defaults, {BEFORE_MAX_PLANS} plans and a "
          f"budget of {PLAN_BUDGET:,} job-plans")
    print("\n| snapshot | one plan() (s) | budget | estimate_starts, wall / CPU (s) | ratio "
          "| jobs with a start "
          "| jobs with a bound (not before) | preview of the 10th / median job (s) |"
          "\n|---|---|---|---|---|---|---|---|")
    for name, sizes in (("small", (64, 200, 100)), ("base", (1024, 5000, 2000))):
        snapshot = build_snapshot(*sizes, seed=1)
        policy = Policy()
        started = time.perf_counter()
        plan(snapshot, NOW, policy)
        plan_s = time.perf_counter() - started
        positions = queue_positions(snapshot, NOW, policy)
        ranked = sorted(positions, key=positions.get)
        for label, budget in (("before", sys.maxsize), ("after", PLAN_BUDGET)):
            started, cpu_started = time.perf_counter(), time.process_time()
            estimates = estimate_starts(snapshot, NOW, policy, budget=budget)
            estimate_s = time.perf_counter() - started
            cpu_s = time.process_time() - cpu_started
            found = sum(estimate.estimated_start is not None for estimate in estimates.values())
            bounded = [estimate.not_before for estimate in estimates.values() if estimate.not_before]
            reached = f" ({(min(bounded) - NOW) / 60:.0f} min ahead)" if bounded else ""
            # The submit form's preview (`until_started`) for the 10th job of the queue and the
            # middle one.
            preview_s = []
            for job_id in (ranked[9], ranked[len(ranked) // 2]):
                started = time.perf_counter()
                estimate_starts(snapshot, NOW, policy, budget=budget, until_started=job_id)
                preview_s.append(time.perf_counter() - started)
            print(f"| {name} {sizes} | {plan_s:.3f} | {label} | {estimate_s:.2f} / {cpu_s:.2f} "
                  f"| {estimate_s / plan_s:.0f}x | {found:,} of {len(estimates):,} "
                  f"| {len(bounded):,}{reached} | {preview_s[0]:.2f} / {preview_s[1]:.2f} |")


def print_coarse_error() -> None:
    """How far the default estimate (coarse past half its budget) is from the exact roll-forward
    (one plan per event, no budget: ~1 min) at the base scale, by the exact wait."""
    from benchmarks.scheduler_plan import NOW, build_snapshot
    from scheduler.queue_estimates import estimate_starts

    snapshot = build_snapshot(1024, 5000, 2000, seed=1)
    policy = Policy()
    started = time.process_time()
    exact = estimate_starts(snapshot, NOW, policy, max_plans=sys.maxsize, budget=sys.maxsize)
    exact_s = time.process_time() - started
    default = estimate_starts(snapshot, NOW, policy)
    print(f"\nexact roll-forward at the base scale: {exact_s:.0f} s CPU, "
          f"{sum(e.estimated_start is not None for e in exact.values()):,} jobs with a start")
    print("\n| exact wait | jobs | default's start − exact start, median (min) | p10 | p90 |"
          "\n|---|---|---|---|---|")
    for low_h, high_h in ((0, 1), (1, 3), (3, 6), (6, 24), (24, 14 * 24)):
        errors = [
            (default[job_id].estimated_start - estimate.estimated_start) / 60
            for job_id, estimate in exact.items()
            if estimate.estimated_start is not None and default[job_id].estimated_start is not None
            and low_h * 3600 <= estimate.estimated_start - NOW < high_h * 3600
        ]
        if errors:
            print(f"| {low_h}–{high_h} h | {len(errors):,} | {percentile(errors, 0.5):.0f} "
                  f"| {percentile(errors, 0.1):.0f} | {percentile(errors, 0.9):.0f} |")


# The roll-forward's only limit before it had a budget (issue #18 item 2 as first merged); still
# `max_plans`' default.
BEFORE_MAX_PLANS = 500


if __name__ == "__main__":
    sys.exit(main())
