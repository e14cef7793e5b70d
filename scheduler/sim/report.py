"""The replay's outputs for people: a text table and a plotly HTML report."""

from __future__ import annotations

from pathlib import Path

from scheduler.sim.replay import Scenario

# The evaluation matrix's metric columns (issue #15), shared by `benchmarks/eval_matrix.py`
# and the what-if on gpubook's own history: (metric key, header, format).
METRIC_COLUMNS = (
    ("wait_mean_s", "mean wait s", "{:,.0f}"),
    ("wait_p95_s", "p95 wait s", "{:,.0f}"),
    ("wait_no_room_share", "no-room wait", "{:.0%}"),
    ("requeue_wait_mean_s", "requeue wait s", "{:,.0f}"),
    ("slowdown_mean", "bounded slowdown", "{:,.1f}"),
    ("utilization", "util", "{:.3f}"),
    ("goodput", "goodput", "{:.3f}"),
    ("lost_gpu_hours", "lost GPU-h", "{:,.1f}"),
    ("lost_share", "lost % cap", "{:.2%}"),
    ("preemptions", "preempt", "{:,.1f}"),
    ("reservations_honoured", "honoured", "{:.1%}"),
    ("quota_violations", "quota viol", "{:.1f}"),
    ("jain_fairness", "Jain", "{:.3f}"),
)


def metric_cells(metrics: dict) -> list[str]:
    return [fmt.format(metrics[key]) for key, _, fmt in METRIC_COLUMNS]


def metrics_table(leading: list[str], rows: list[tuple[list[str], dict]]) -> str:
    """A markdown table: the `leading` columns (each row's first cells), then the metrics."""
    header = leading + [title for _, title, _ in METRIC_COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for cells, metrics in rows:
        lines.append("| " + " | ".join(cells + metric_cells(metrics)) + " |")
    return "\n".join(lines)


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
