"""Trace-replay simulator: `python -m scheduler.simulate` (and `manage.py simulate`).

Replays a job trace (CSV `job_id,user,group,submit_time,duration_s,num_gpus,status`, e.g.
`../shared/traces/philly.csv`) through the same `plan()` that reconcile calls, with the
event-driven clock and executor of `scheduler.engine`, under three policies side by side:

* `fifo`: a plain FIFO cluster, no calendar: bookings are submitted as ordinary jobs at their
  booked start; strict order (the head job blocks), no estimates.
* `reservations-only`: the calendar is honoured (GPUs cleared with grace, reserved runs
  started at slot start, stopped at slot end), the queue is strict FIFO without estimates:
  a queued job takes any idle GPU and is stopped when a booking needs it.
* `gpubook`: everything: fair share with entry penalty and aging, backfill with runtime
  estimates (Tsafrir), preemptible backfill, EASY protection, no-show/early-finish release.

Jobs larger than a node are placed on **whole nodes** (every policy); only jobs larger than
the whole cluster are reported as unplaceable. The workload choices (bookings, lead times,
checkpointable jobs, teams, quotas) are in `scheduler.workload` and the scenario block.

Metrics (measured over the trace window, first to last submission):
* `utilization`: busy GPU-time / (capacity × window); `utilization_of_offered`: busy GPU-time
  / min(capacity × window, offered), where offered is the GPU-time of the window's jobs
  that could run inside the window (each job from its submission to the window's end).
* `goodput`: GPU-time that advanced jobs (no restart overhead, no lost work) / capacity.
* `wait_*`: first start − submit of queued jobs (bookings excluded; for fifo, booked jobs
  are excluded too so all three measure the same jobs); `slowdown_mean`: bounded slowdown
  (response / max(duration, 10 s)); `jain_fairness`: Jain's index over users' mean slowdown.
* `preemptions`: runs stopped or killed before their job finished, except at the end of
  their own slot; `reservations_honoured`: bookings whose job started at the booked start
  (fifo: the job started when its booking would have begun); `quota_violations`: teams
  whose charge exceeded their quota; `unplaceable_jobs`: jobs larger than the cluster.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from scheduler.actions import Reason
from scheduler.engine import SimJob, Simulation, SimulationConfig, SimulationResult
from scheduler.policy import Policy, QueueOrder
from scheduler.snapshot import RunKind
from scheduler.workload import TraceJob, Workload, build_workload, make_gpus

POLICY_NAMES = ("fifo", "reservations-only", "gpubook")
# Quotas are sized to each team's demand divided by this load, i.e. generous: the trace
# has no quotas, so the replay only checks that none is overspent.
QUOTA_HEADROOM = 1.25
SLOWDOWN_BOUND_S = 10.0
SERIES_BIN_S = 3600.0


def policy_for(name: str, *, grace_s: float = 60.0) -> Policy:
    baseline = Policy(
        grace_s=grace_s,
        queue_order=QueueOrder.FIFO,
        backfill=False,
        use_estimates=False,
        release_no_show=False,
        release_early_finish=False,
        allow_multi_node=True,
    )
    if name in ("fifo", "reservations-only"):
        return baseline
    if name == "gpubook":
        return Policy(grace_s=grace_s, allow_multi_node=True)
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")


# ----- input


def _parse_time(text: str) -> float:
    text = text.strip()
    multipliers = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
    if text and text[-1] in multipliers:
        return float(text[:-1]) * multipliers[text[-1]]
    return float(text)


def parse_window(text: str | None) -> tuple[float, float]:
    """`START:END` in trace seconds (suffix s/m/h/d allowed); either side may be empty."""
    if not text:
        return (-math.inf, math.inf)
    start_text, separator, end_text = text.partition(":")
    if not separator:
        raise argparse.ArgumentTypeError("--window must look like START:END, e.g. 20d:30d")
    start = _parse_time(start_text) if start_text.strip() else -math.inf
    end = _parse_time(end_text) if end_text.strip() else math.inf
    if end <= start:
        raise argparse.ArgumentTypeError("--window END must be after START")
    return (start, end)


def read_trace(path: Path, window: tuple[float, float]) -> list[TraceJob]:
    jobs = []
    seen: set[int] = set()
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            submit_s = float(row["submit_time"])
            if not (window[0] <= submit_s < window[1]):
                continue
            job_id = int(row["job_id"])
            if job_id in seen:
                raise ValueError(f"{path}: job_id {job_id} appears twice")
            seen.add(job_id)
            jobs.append(
                TraceJob(
                    job_id=job_id,
                    user=row["user"] or f"job-{job_id}",
                    group=row["group"],
                    submit_s=submit_s,
                    duration_s=float(row["duration_s"]),
                    gpus=int(row["num_gpus"]),
                    status=row["status"],
                )
            )
    jobs.sort(key=lambda job: (job.submit_s, job.job_id))
    return jobs


# ----- running


@dataclass(frozen=True, slots=True)
class Scenario:
    trace: str
    jobs: int
    gpus: int
    gpus_per_node: int
    window_start_s: float
    window_end_s: float
    offered_gpus: float
    offered_load: float
    reservation_share: float
    bookings: int
    booked_gpu_hours: float
    bookings_shifted: int
    bookings_refused: int
    slot_minutes: float
    restart_overhead_s: float
    grace_s: float
    seed: int
    large_jobs: str
    checkpointable_share: float
    quota: str


def _fresh_jobs(workload: Workload, *, without_bookings: bool) -> list[SimJob]:
    jobs = [replace(job) for job in workload.jobs]
    if without_bookings:
        jobs = [replace(job, booking_id=None) for job in jobs]
    return jobs


def team_quotas(workload: Workload, policy: Policy, load: float) -> dict[str, float]:
    demand: dict[str, float] = {}
    booked = {booking.job_id for booking in workload.bookings}
    for job in workload.jobs:
        factor = 1.0 if job.id in booked else policy.usage_factor
        demand[job.team] = demand.get(job.team, 0.0) + job.gpus * job.duration_s * factor
    return {
        team: QUOTA_HEADROOM * gpu_s / max(min(load, 1.0), 0.1)
        for team, gpu_s in sorted(demand.items())
    }


def run_policy(
    name: str,
    workload: Workload,
    *,
    gpus_total: int,
    gpus_per_node: int,
    restart_overhead_s: float,
    load: float,
    grace_s: float,
) -> tuple[SimulationResult, float]:
    policy = policy_for(name, grace_s=grace_s)
    fifo = name == "fifo"
    config = SimulationConfig(
        gpus=make_gpus(gpus_total, gpus_per_node),
        policy=policy,
        restart_overhead_s=restart_overhead_s,
        team_quota_gpu_s=team_quotas(workload, policy, load),
        use_estimator=policy.use_estimates,
    )
    simulation = Simulation(
        config,
        _fresh_jobs(workload, without_bookings=fifo),
        () if fifo else workload.bookings,
    )
    started = time.perf_counter()
    result = simulation.run()
    return result, time.perf_counter() - started


# ----- metrics


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(math.ceil(fraction * len(ordered)) - 1, 0)
    return float(ordered[rank])


def jain_index(values: Sequence[float]) -> float:
    if not values:
        return 1.0
    total = sum(values)
    squares = sum(value * value for value in values)
    return total * total / (len(values) * squares) if squares else 1.0


def _overlap(start: float, end: float, window_start: float, window_end: float) -> float:
    return max(0.0, min(end, window_end) - max(start, window_start))


def compute_metrics(
    result: SimulationResult,
    workload: Workload,
    *,
    policy_name: str,
    gpus_total: int,
    window: tuple[float, float],
    quotas: dict[str, float],
    wall_s: float,
) -> dict[str, float | int]:
    window_start, window_end = window
    window_length = max(window_end - window_start, 1.0)
    capacity_gpu_s = gpus_total * window_length
    busy = useful = 0.0
    preemptions = 0
    for record in result.run_records:
        overlap = _overlap(record.start_s, record.end_s, window_start, window_end)
        busy += record.gpus * overlap
        length = record.end_s - record.start_s
        if length > 0:
            useful += record.gpus * overlap * (record.useful_s / length)
        if record.how != "completed" and not (
            record.kind == RunKind.RESERVED and record.how in ("checkpointed", "killed")
        ):
            preemptions += 1
    offered = sum(
        job.gpus * min(job.duration_s, max(window_end - job.submit_s, 0.0))
        for job in workload.jobs
        if window_start <= job.submit_s <= window_end
    )

    booked_job_ids = {booking.job_id for booking in workload.bookings}
    waits: list[float] = []
    slowdowns_by_user: dict[str, list[float]] = {}
    slowdowns: list[float] = []
    for job in result.jobs.values():
        if job.id in booked_job_ids or job.first_start_s is None:
            continue
        waits.append(job.first_start_s - job.submit_s)
        if job.completed_s is not None:
            slowdown = max(
                (job.completed_s - job.submit_s) / max(job.duration_s, SLOWDOWN_BOUND_S), 1.0
            )
            slowdowns.append(slowdown)
            slowdowns_by_user.setdefault(job.user, []).append(slowdown)

    if policy_name == "fifo":
        honoured = sum(
            1
            for booking in workload.bookings
            if result.jobs[booking.job_id].first_start_s is not None
            and result.jobs[booking.job_id].first_start_s <= booking.start_s + 1e-6
        )
    else:
        honoured = sum(
            1
            for booking in workload.bookings
            if result.reserved_start_s.get(booking.id, math.inf) <= booking.start_s + 1e-6
        )
    unplaceable = sum(1 for job in result.jobs.values() if job.gpus > gpus_total)
    violations = sum(
        1 for team, charge in result.team_charges_gpu_s.items() if charge > quotas.get(team, 0)
    )
    user_means = [sum(values) / len(values) for values in slowdowns_by_user.values()]
    return {
        "utilization": busy / capacity_gpu_s,
        "utilization_of_offered": busy / max(min(capacity_gpu_s, offered), 1.0),
        "goodput": useful / capacity_gpu_s,
        "wait_mean_s": sum(waits) / len(waits) if waits else 0.0,
        "wait_p50_s": percentile(waits, 0.5),
        "wait_p95_s": percentile(waits, 0.95),
        "slowdown_mean": sum(slowdowns) / len(slowdowns) if slowdowns else 0.0,
        "jain_fairness": jain_index(user_means),
        "preemptions": preemptions,
        "reservations_honoured": honoured / len(workload.bookings) if workload.bookings else 1.0,
        "quota_violations": violations,
        "unplaceable_jobs": unplaceable,
        "wall_s": wall_s,
        "jobs_completed": sum(1 for job in result.jobs.values() if job.completed_s is not None),
        "releases_no_show": sum(1 for _, r in result.released.values() if r == Reason.NO_SHOW),
        "releases_early_finish": sum(
            1 for _, reason in result.released.values() if reason == Reason.JOB_FINISHED_EARLY
        ),
        "lost_gpu_hours": sum(
            record.gpus * (record.end_s - record.start_s - record.overhead_s - record.useful_s)
            for record in result.run_records
            if record.how in ("killed", "stopped_lost")
        )
        / 3600.0,
        "plan_calls": result.plan_calls,
    }


def series(result: SimulationResult, gpus_total: int, window: tuple[float, float]) -> dict:
    """Hourly utilization and queue length, and the sorted waits, for the HTML report."""
    start, end = window
    bins = max(math.ceil((end - start) / SERIES_BIN_S), 1)
    busy = [0.0] * bins
    for record in result.run_records:
        first = max(int((record.start_s - start) // SERIES_BIN_S), 0)
        last = min(int((record.end_s - start) // SERIES_BIN_S), bins - 1)
        for bin_index in range(first, last + 1):
            bin_start = start + bin_index * SERIES_BIN_S
            busy[bin_index] += record.gpus * _overlap(
                record.start_s, record.end_s, bin_start, bin_start + SERIES_BIN_S
            )
    utilization = [value / (gpus_total * SERIES_BIN_S) for value in busy]
    queue = [0] * bins
    for at_s, length in result.queue_length:
        bin_index = int((at_s - start) // SERIES_BIN_S)
        if 0 <= bin_index < bins:
            queue[bin_index] = max(queue[bin_index], length)
    booked = {booking.job_id for booking in result.bookings}
    waits = sorted(
        job.first_start_s - job.submit_s
        for job in result.jobs.values()
        if job.first_start_s is not None and job.id not in booked and job.booking_id is None
    )
    hours = [(start + (index + 0.5) * SERIES_BIN_S) / 3600.0 for index in range(bins)]
    return {"hours": hours, "utilization": utilization, "queue": queue, "waits": waits}


def write_html(path: Path, all_series: dict[str, dict], scenario: Scenario) -> None:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    figure = make_subplots(
        rows=3,
        cols=1,
        subplot_titles=(
            "GPU utilization (hourly)",
            "Queue length (hourly max)",
            "Queue wait CDF",
        ),
        vertical_spacing=0.08,
    )
    for name, data in all_series.items():
        figure.add_trace(
            go.Scatter(x=data["hours"], y=data["utilization"], name=f"{name} utilization",
                       legendgroup=name, mode="lines"),
            row=1, col=1,
        )
        figure.add_trace(
            go.Scatter(x=data["hours"], y=data["queue"], name=f"{name} queue",
                       legendgroup=name, mode="lines"),
            row=2, col=1,
        )
        waits = data["waits"]
        step = max(len(waits) // 2000, 1)
        sample = waits[::step]
        figure.add_trace(
            go.Scatter(
                x=[max(wait, 1.0) / 3600.0 for wait in sample],
                y=[(index * step + 1) / len(waits) for index in range(len(sample))],
                name=f"{name} wait CDF",
                legendgroup=name,
                mode="lines",
            ),
            row=3, col=1,
        )
    figure.update_xaxes(title_text="trace time (hours)", row=1, col=1)
    figure.update_xaxes(title_text="trace time (hours)", row=2, col=1)
    figure.update_xaxes(title_text="wait (hours, log)", type="log", row=3, col=1)
    figure.update_yaxes(title_text="busy / capacity", row=1, col=1)
    figure.update_yaxes(title_text="jobs waiting", row=2, col=1)
    figure.update_yaxes(title_text="fraction of jobs", row=3, col=1)
    figure.update_layout(
        title=(
            f"gpubook replay of {Path(scenario.trace).name}: {scenario.gpus} GPUs, "
            f"offered load {scenario.offered_load:.0%}, "
            f"{scenario.reservation_share:.0%} of GPU-hours booked"
        ),
        height=1100,
    )
    path.write_text(figure.to_html(include_plotlyjs=True, full_html=True))


# ----- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m scheduler.simulate",
        description="Replay a GPU job trace through gpubook's plan() and baselines.",
    )
    parser.add_argument("--trace", type=Path, required=True, help="trace CSV")
    parser.add_argument("--gpus", type=int, default=1024, help="cluster size (default 1024)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    parser.add_argument(
        "--policy",
        default=",".join(POLICY_NAMES),
        help="one or a comma-separated list of fifo, reservations-only, gpubook (default all)",
    )
    parser.add_argument(
        "--reservation-share",
        type=float,
        default=0.3,
        help="fraction of GPU-hours that arrive as calendar bookings (default 0.3)",
    )
    parser.add_argument("--seed", type=int, default=1, help="seed for the workload choices")
    parser.add_argument("--slot-minutes", type=float, default=30.0, help="slot size (default 30)")
    parser.add_argument(
        "--restart-overhead-s",
        type=float,
        default=60.0,
        help="GPU time each resume from a checkpoint costs (default 60)",
    )
    parser.add_argument(
        "--window",
        type=parse_window,
        default=None,
        help="replay only jobs submitted in START:END trace seconds (s/m/h/d suffix), e.g. 20d:",
    )
    parser.add_argument("--json", type=Path, help="write the metrics as JSON here")
    parser.add_argument("--html", type=Path, help="write a plotly HTML report here")
    return parser


def simulate(arguments: argparse.Namespace) -> dict:
    names = [name.strip() for name in arguments.policy.split(",") if name.strip()]
    for name in names:
        if name not in POLICY_NAMES:
            raise SystemExit(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
    if not 0 <= arguments.reservation_share < 1:
        raise SystemExit("--reservation-share must be in [0, 1)")
    if arguments.gpus < 1 or arguments.gpus_per_node < 1:
        raise SystemExit("--gpus and --gpus-per-node must be positive")
    window = arguments.window or (-math.inf, math.inf)
    trace = read_trace(arguments.trace, window)
    if not trace:
        raise SystemExit("no jobs in the trace window")
    grace_s = Policy().grace_s
    slot_s = arguments.slot_minutes * 60.0
    gpus = make_gpus(arguments.gpus, arguments.gpus_per_node)
    workload = build_workload(
        trace,
        gpus=gpus,
        gpus_per_node=arguments.gpus_per_node,
        reservation_share=arguments.reservation_share,
        slot_s=slot_s,
        grace_s=grace_s,
        seed=arguments.seed,
    )
    measured = (trace[0].submit_s, trace[-1].submit_s)
    length = max(measured[1] - measured[0], 1.0)
    offered_gpu_s = sum(job.gpus * job.duration_s for job in trace)
    offered_gpus = offered_gpu_s / length
    load = offered_gpus / arguments.gpus
    scenario = Scenario(
        trace=str(arguments.trace),
        jobs=len(trace),
        gpus=arguments.gpus,
        gpus_per_node=arguments.gpus_per_node,
        window_start_s=measured[0],
        window_end_s=measured[1],
        offered_gpus=offered_gpus,
        offered_load=load,
        reservation_share=arguments.reservation_share,
        bookings=len(workload.bookings),
        booked_gpu_hours=workload.booked_gpu_s / 3600.0,
        bookings_shifted=workload.bookings_shifted,
        bookings_refused=workload.bookings_refused,
        slot_minutes=arguments.slot_minutes,
        restart_overhead_s=arguments.restart_overhead_s,
        grace_s=grace_s,
        seed=arguments.seed,
        large_jobs="whole nodes: jobs larger than a node take whole idle nodes; only jobs "
        "larger than the cluster are unplaceable",
        checkpointable_share=sum(job.checkpointable for job in workload.jobs) / len(trace),
        quota=f"per team {QUOTA_HEADROOM}x its demand / offered load, used as fair-share "
        "shares and checked after the replay; not enforced by plan (the trace has no quotas)",
    )
    policies: dict[str, dict] = {}
    all_series: dict[str, dict] = {}
    for name in names:
        result, wall_s = run_policy(
            name,
            workload,
            gpus_total=arguments.gpus,
            gpus_per_node=arguments.gpus_per_node,
            restart_overhead_s=arguments.restart_overhead_s,
            load=load,
            grace_s=grace_s,
        )
        quotas = team_quotas(workload, policy_for(name, grace_s=grace_s), load)
        policies[name] = compute_metrics(
            result,
            workload,
            policy_name=name,
            gpus_total=arguments.gpus,
            window=measured,
            quotas=quotas,
            wall_s=wall_s,
        )
        if arguments.html:
            all_series[name] = series(result, arguments.gpus, measured)
        print(f"  {name}: simulated in {wall_s:.1f} s", file=sys.stderr)
    report = {"policies": policies, "scenario": asdict(scenario)}
    if arguments.json:
        arguments.json.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    if arguments.html:
        write_html(arguments.html, all_series, scenario)
    return report


def format_report(report: dict) -> str:
    scenario = report["scenario"]
    lines = [
        f"trace {scenario['trace']}: {scenario['jobs']} jobs on {scenario['gpus']} GPUs "
        f"({scenario['gpus_per_node']}/node), offered {scenario['offered_gpus']:.0f} GPUs "
        f"= {scenario['offered_load']:.0%} of capacity",
        f"bookings: {scenario['bookings']} ({scenario['booked_gpu_hours']:.0f} GPU-h, target "
        f"{scenario['reservation_share']:.0%}), shifted {scenario['bookings_shifted']}, "
        f"refused {scenario['bookings_refused']}; large jobs: {scenario['large_jobs']}",
    ]
    names = list(report["policies"])
    keys = list(next(iter(report["policies"].values())))
    lines.append(f"{'metric':<24}" + "".join(f"{name:>20}" for name in names))
    for key in keys:
        row = f"{key:<24}"
        for name in names:
            value = report["policies"][name][key]
            row += f"{value:>20.3f}" if isinstance(value, float) else f"{value:>20}"
        lines.append(row)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = build_parser().parse_args(argv)
    report = simulate(arguments)
    print(format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
