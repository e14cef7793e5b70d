"""Trace-replay simulator: `python -m scheduler.sim` (and `manage.py simulate`).

Replays a job trace (e.g. `../shared/traces/philly.csv`, schema in `scheduler.sim.trace`)
through the same `plan()` that reconcile calls, with the event-driven clock and executor of
`scheduler.sim.engine`, under the policies of `scheduler.sim.policies` side by side. The
workload choices (bookings, lead times, checkpointable jobs, teams) are in
`scheduler.sim.workload`, the quotas in `scheduler.sim.replay`, the metrics in
`scheduler.sim.metrics`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from scheduler.policy import Policy
from scheduler.sim.metrics import compute_metrics, series
from scheduler.sim.policies import POLICY_NAMES, policy_for
from scheduler.sim.replay import QUOTA_HEADROOM, Scenario, run_policy, team_quotas
from scheduler.sim.report import format_report, write_html
from scheduler.sim.trace import parse_window, read_trace
from scheduler.sim.workload import build_workload, make_gpus


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m scheduler.sim",
        description="Replay a GPU job trace through gpubook's plan() and baselines.",
    )
    parser.add_argument("--trace", type=Path, required=True, help="trace CSV")
    parser.add_argument("--gpus", type=int, default=1024, help="cluster size (default 1024)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    parser.add_argument(
        "--policy",
        default=",".join(POLICY_NAMES),
        help="one or a comma-separated list of " + ", ".join(POLICY_NAMES) + " (default all)",
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



def main(argv: Sequence[str] | None = None) -> int:
    arguments = build_parser().parse_args(argv)
    report = simulate(arguments)
    print(format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
