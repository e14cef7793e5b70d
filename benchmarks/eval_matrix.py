"""The evaluation matrix (issue #15): every trace, two cluster sizes, three booked shares,
several seeds, four policies, one table.

    .venv/bin/python benchmarks/eval_matrix.py [--seeds 1,2,3,4] [--workers 2] \
        [--markdown out.md] [--json out.json] [--html out.html] [--gpubook FIELD=VALUE ...]

**Bounded time.** A whole trace takes minutes per policy, so each trace is replayed over a
fixed, documented window of its jobs (no sampling inside the window: arrivals, sizes and
durations are the trace's own), and the cluster is sized to the window:

* philly: Mon 2017-09-25 00:00 → Tue 00:00 (1 day of the dense part, 1,400-odd jobs);
* helios_venus: Sat 2020-05-30 00:00 → Mon 06-01 00:00 (2 days, about 750 jobs);
* itp_cluster04: days 10 → 12 after collection start (2 days, about 800 jobs).

Offered load is measured as the GPU-time the window's jobs could use inside the window
(each job from its submission to the window's end, at most its duration) ÷ the window's
length: long jobs (Philly's run up to 60 days) would otherwise count GPU-hours that no
cluster can deliver inside the window. Sizes: that load at **0.95** (near capacity) and at
**0.70** of capacity, rounded up to whole 8-GPU nodes. The cluster starts empty at the
window's start; jobs that outlive the window still run to the end, and metrics are measured
over the window (`scheduler.sim.metrics`). With two workers the whole matrix (3 traces × 2
sizes × 3 shares × 4 seeds × 4 policies = 288 replays) takes a few minutes on two cores.

**Seeds.** The seed draws which jobs are booked, how far ahead, and which can checkpoint.
The policy's first three rounds were judged on seeds 1 and 2; seeds 3 and 4 were added
after them, unseen by any of those choices, and showed that two seeds flattered it (three
lost-work misses appear on 3 and 4 alone), so the matrix averages all four.

**Targets** (issue #15 item 2), checked on every gpubook row against the FIFO row of the
same trace, size and share (seed means): with bookings: 100 % honoured, 0 quota
violations, mean wait ≤ FIFO's, lost GPU-hours ≤ 1 % of capacity, utilization and Jain
fairness ≥ FIFO's − 0.01; without bookings: mean wait ≤ 0.15× FIFO's, p95 ≤ 0.1× FIFO's,
preemptions ≤ 1 % of jobs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scheduler.sim.metrics import compute_metrics  # noqa: E402
from scheduler.sim.policies import POLICY_NAMES, policy_for, policy_overrides  # noqa: E402
from scheduler.sim.replay import run_policy, team_quotas  # noqa: E402
from scheduler.sim.report import metrics_table  # noqa: E402
from scheduler.sim.trace import read_trace  # noqa: E402
from scheduler.sim.workload import Workload, build_workload, make_gpus  # noqa: E402

# `../shared/traces` next to the checkout (a worktree sits one level deeper); or $GPUBOOK_TRACES.
TRACES_DIR = Path(
    os.environ.get("GPUBOOK_TRACES")
    or next(
        (str(base / "shared" / "traces") for base in (ROOT.parent, ROOT.parent.parent)
         if (base / "shared" / "traces").exists()),
        str(ROOT.parent / "shared" / "traces"),
    )
).resolve()
DAY_S = 86400.0
GPUS_PER_NODE = 8
LOADS = (0.95, 0.70)
SHARES = (0.0, 0.2, 0.35)
SEEDS = (1, 2, 3, 4)
SLOT_S = 1800.0
RESTART_OVERHEAD_S = 60.0
GRACE_S = 60.0


@dataclass(frozen=True)
class TraceWindow:
    name: str
    file: str
    start_s: float
    days: float

    @property
    def window(self) -> tuple[float, float]:
        return (self.start_s, self.start_s + self.days * DAY_S)


WINDOWS = (
    TraceWindow("philly", "philly.csv", 21 * DAY_S, 1.0),
    TraceWindow("helios_venus", "helios_venus.csv", 2 * DAY_S, 2.0),
    TraceWindow("itp_cluster04", "itp_cluster04.csv", 10 * DAY_S, 2.0),
)

def offered_gpus(trace, window: tuple[float, float]) -> float:
    start, end = window
    return sum(job.gpus * min(job.duration_s, end - job.submit_s) for job in trace) / (
        end - start
    )


def cluster_size(offered: float, load: float) -> int:
    return max(GPUS_PER_NODE, math.ceil(offered / load / GPUS_PER_NODE) * GPUS_PER_NODE)


def run_cell(task: tuple) -> dict:
    """One replay: (trace window, load, share, seed, policy name, gpubook overrides,
    static booking placement)."""
    setup, load, share, seed, name, overrides, static_booking = task
    window = setup.window
    trace = read_trace(TRACES_DIR / setup.file, window)
    offered = offered_gpus(trace, window)
    gpus_total = cluster_size(offered, load)
    gpus = make_gpus(gpus_total, GPUS_PER_NODE)
    workload = build_workload(
        trace, gpus=gpus, gpus_per_node=GPUS_PER_NODE, reservation_share=share,
        slot_s=SLOT_S, grace_s=GRACE_S, seed=seed,
    )
    policy = policy_for(name, grace_s=GRACE_S)
    if name == "gpubook" and overrides:
        policy = replace(policy, **overrides)
    actual_load = offered / gpus_total
    result, wall_s = run_policy(
        name, workload, gpus_total=gpus_total, gpus_per_node=GPUS_PER_NODE,
        restart_overhead_s=RESTART_OVERHEAD_S, load=actual_load, grace_s=GRACE_S,
        policy=policy, run_aware_booking=False if static_booking else None,
    )
    metrics = compute_metrics(
        result, workload, policy_name=name, gpus_total=gpus_total, window=window,
        quotas=team_quotas(workload, policy, actual_load), wall_s=wall_s,
    )
    metrics["jobs"] = len(trace)
    return {
        "trace": setup.name, "load": load, "share": share, "seed": seed, "policy": name,
        "gpus": gpus_total, "offered_gpus": offered, "jobs": len(trace),
        "bookings": len(workload.bookings), "metrics": metrics,
        "queued": queued_composition(workload),
    }


def queued_composition(workload: Workload) -> dict[str, float]:
    """The jobs left to the queue once the bookings are taken (a booking is GPUs of one
    node, so only single-node jobs become bookings): how many, and the share of their
    GPU-time in jobs wider than a node. On helios and ITP at 35 % booked nearly every
    single-node job is booked, so the queue is a few dozen multi-node jobs; the targets
    on those rows are read with that in mind."""
    booked = {booking.job_id for booking in workload.bookings}
    queued = [job for job in workload.jobs if job.id not in booked]
    gpu_s = sum(job.gpus * job.duration_s for job in queued)
    wide_gpu_s = sum(job.gpus * job.duration_s for job in queued if job.gpus > GPUS_PER_NODE)
    return {"jobs": len(queued), "multi_node_share": wide_gpu_s / gpu_s if gpu_s else 0.0}


def aggregate(cells: list[dict]) -> list[dict]:
    """Seed means per (trace, load, share, policy), in matrix order."""
    groups: dict[tuple, list[dict]] = {}
    for cell in cells:
        groups.setdefault(
            (cell["trace"], cell["load"], cell["share"], cell["policy"]), []
        ).append(cell)
    rows = []
    order = {setup.name: number for number, setup in enumerate(WINDOWS)}
    for key in sorted(
        groups,
        key=lambda key: (order[key[0]], -key[1], key[2], POLICY_NAMES.index(key[3])),
    ):
        members = groups[key]
        metrics = {
            metric: sum(member["metrics"][metric] for member in members) / len(members)
            for metric in members[0]["metrics"]
        }
        queued = {
            field: sum(member["queued"][field] for member in members) / len(members)
            for field in members[0]["queued"]
        }
        rows.append({
            "trace": key[0], "load": key[1], "share": key[2], "policy": key[3],
            "gpus": members[0]["gpus"], "jobs": members[0]["jobs"],
            "seeds": sorted(member["seed"] for member in members), "metrics": metrics,
            "queued": queued,
        })
    return rows


def check_targets(rows: list[dict]) -> list[dict]:
    """Issue #15 item 2 on each gpubook row, against FIFO of the same trace/size/share."""
    by_key = {(row["trace"], row["load"], row["share"], row["policy"]): row for row in rows}
    verdicts = []
    for row in rows:
        if row["policy"] != "gpubook":
            continue
        fifo = by_key[(row["trace"], row["load"], row["share"], "fifo")]["metrics"]
        mine = row["metrics"]
        checks: list[tuple[str, bool]] = []
        if row["share"] > 0:
            checks = [
                ("100% honoured", mine["reservations_honoured"] >= 1.0 - 1e-9),
                ("0 quota violations", mine["quota_violations"] == 0),
                ("wait <= FIFO", mine["wait_mean_s"] <= fifo["wait_mean_s"]),
                ("lost <= 1% cap", mine["lost_share"] <= 0.01),
                ("util >= FIFO-0.01", mine["utilization"] >= fifo["utilization"] - 0.01),
                ("Jain >= FIFO-0.01", mine["jain_fairness"] >= fifo["jain_fairness"] - 0.01),
            ]
        else:
            checks = [
                ("wait <= 0.15 FIFO", mine["wait_mean_s"] <= 0.15 * fifo["wait_mean_s"]),
                ("p95 <= 0.1 FIFO", mine["wait_p95_s"] <= 0.1 * fifo["wait_p95_s"]),
                ("preempt <= 1% jobs", mine["preemptions"] <= 0.01 * row["jobs"]),
            ]
        verdicts.append({
            "trace": row["trace"], "load": row["load"], "share": row["share"],
            "queued": row["queued"],
            "met": [name for name, ok in checks if ok],
            "missed": [name for name, ok in checks if not ok],
        })
    return verdicts


def markdown(rows: list[dict], verdicts: list[dict]) -> str:
    lines = [metrics_table(
        ["trace", "load", "GPUs", "booked", "policy"],
        [
            ([row["trace"], f"{row['load']:.2f}", str(row["gpus"]), f"{row['share']:.2f}",
              row["policy"]], row["metrics"])
            for row in rows
        ],
    )]
    lines += [
        "",
        "| trace | load | booked | queued jobs | multi-node share of their GPU-time "
        "| gpubook targets missed |",
        "|---|---|---|---|---|---|",
    ]
    for verdict in verdicts:
        missed = ", ".join(verdict["missed"]) or "none (all met)"
        queued = verdict["queued"]
        lines.append(
            f"| {verdict['trace']} | {verdict['load']:.2f} | {verdict['share']:.2f} "
            f"| {queued['jobs']:,.0f} | {queued['multi_node_share']:.0%} | {missed} |"
        )
    met = sum(not verdict["missed"] for verdict in verdicts)
    lines.append("")
    lines.append(f"gpubook meets every target on {met} of {len(verdicts)} rows.")
    return "\n".join(lines)


def write_html(path: Path, rows: list[dict]) -> None:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    labels = sorted(
        {(row["trace"], row["load"], row["share"]) for row in rows},
        key=lambda key: ([setup.name for setup in WINDOWS].index(key[0]), -key[1], key[2]),
    )
    names = [f"{trace} @{load:.2f} booked {share:.2f}" for trace, load, share in labels]
    panels = (("wait_mean_s", "mean wait (s)"), ("wait_p95_s", "p95 wait (s)"),
              ("utilization", "utilization"), ("lost_share", "lost GPU-h / capacity"))
    figure = make_subplots(rows=len(panels), cols=1, subplot_titles=[t for _, t in panels],
                           vertical_spacing=0.06)
    by_key = {(row["trace"], row["load"], row["share"], row["policy"]): row for row in rows}
    for panel, (metric, _) in enumerate(panels, start=1):
        for policy in POLICY_NAMES:
            values = [
                by_key[(*label, policy)]["metrics"][metric] if (*label, policy) in by_key
                else None
                for label in labels
            ]
            figure.add_trace(
                go.Bar(x=names, y=values, name=policy, legendgroup=policy,
                       showlegend=panel == 1),
                row=panel, col=1,
            )
    figure.update_layout(barmode="group", height=350 * len(panels),
                         title="gpubook evaluation matrix (seed means)")
    path.write_text(figure.to_html(include_plotlyjs=True, full_html=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    parser.add_argument("--traces", default=",".join(setup.name for setup in WINDOWS))
    parser.add_argument("--policies", default=",".join(POLICY_NAMES))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--gpubook", action="append", default=[],
                        help="FIELD=VALUE: a gpubook Policy variant (repeatable)")
    parser.add_argument("--static-booking", action="store_true",
                        help="gpubook keeps the workload's blind booking placement too")
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--html", type=Path)
    arguments = parser.parse_args(argv)
    if not TRACES_DIR.exists():
        print(f"traces not found: {TRACES_DIR}", file=sys.stderr)
        return 1
    seeds = [int(seed) for seed in arguments.seeds.split(",")]
    wanted = set(arguments.traces.split(","))
    policies = [name for name in arguments.policies.split(",") if name]
    if "gpubook" in policies and "fifo" not in policies:
        policies.insert(0, "fifo")  # the targets are relative to FIFO
    try:
        overrides = policy_overrides(arguments.gpubook)
    except ValueError as error:
        raise SystemExit(f"--gpubook: {error}") from None
    tasks = [
        (setup, load, share, seed, name, overrides, arguments.static_booking)
        for setup in WINDOWS if setup.name in wanted
        for load in LOADS for share in SHARES for seed in seeds for name in policies
    ]
    # Longest first (gpubook and easy on philly), so two workers finish together.
    cost = {"gpubook": 3, "easy": 2, "reservations-only": 1, "fifo": 1}
    tasks.sort(key=lambda task: (-cost[task[4]] * (2 if task[0].name == "philly" else 1)))
    started = time.perf_counter()
    if arguments.workers > 1:
        with ProcessPoolExecutor(max_workers=arguments.workers) as pool:
            cells = list(pool.map(run_cell, tasks))
    else:
        cells = [run_cell(task) for task in tasks]
    elapsed = time.perf_counter() - started
    rows = aggregate(cells)
    verdicts = check_targets(rows) if "fifo" in policies else []
    table = markdown(rows, verdicts)
    print(table)
    replay_s = sum(cell["metrics"]["wall_s"] for cell in cells)
    print(f"\n{len(cells)} replays in {elapsed:.0f} s wall with {arguments.workers} workers "
          f"({replay_s:.0f} s of simulation); gpubook overrides: {overrides or 'none'}")
    if arguments.markdown:
        arguments.markdown.write_text(table + "\n")
    if arguments.json:
        arguments.json.write_text(json.dumps(
            {"rows": rows, "targets": verdicts, "cells": cells, "overrides": overrides},
            indent=1, sort_keys=True, default=str,
        ) + "\n")
    if arguments.html:
        write_html(arguments.html, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
