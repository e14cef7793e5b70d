"""Plotly figures, rendered on the server into an HTML fragment. The page loads the vendored
plotly.js once (static/vendor/plotly/); the fragments never include or fetch it."""

import json

import plotly.graph_objects as go
import plotly.io
from django.utils.html import format_html, json_script
from django.utils.safestring import SafeString
from plotly.subplots import make_subplots

from reports.selectors import Heatmap, IdleReport, QuotaRow

PLOTLY_VERSION = "4.1.1"  # the plotly.js that the installed plotly package bundles
CONFIG = {"displaylogo": False, "responsive": True}


def to_html(figure: go.Figure, *, element_id: str) -> SafeString:
    """An empty chart element plus the figure as a `json_script` data block; the static
    static/js/plotly_figures.js draws it (the Content-Security-Policy allows no inline script)."""
    data = json.loads(plotly.io.to_json(figure, validate=False))
    data["config"] = CONFIG
    return format_html(
        '<div id="{}" class="plotly-figure" data-figure="{}"></div>{}',
        element_id, f"{element_id}-data", json_script(data, f"{element_id}-data"),
    )


def heatmap_figure(heatmap: Heatmap, *, hour_labels: list[str]) -> go.Figure:
    names = [f"{gpu.node.name} GPU {gpu.index}" for gpu in heatmap.gpus]
    figure = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                           subplot_titles=("Booked (% of the hour)", "Used (mean GPU utilization %)"))
    booked = [[round(value * 100, 1) for value in row] for row in heatmap.booked]
    used = [[None if value is None else round(value * 100, 1) for value in row] for row in heatmap.used]
    figure.add_trace(go.Heatmap(z=booked, x=hour_labels, y=names, zmin=0, zmax=100, colorscale="Blues",
                                colorbar={"title": "%", "y": 0.78, "len": 0.45},
                                hovertemplate="%{y}<br>%{x}<br>booked %{z}%<extra></extra>"), row=1, col=1)
    figure.add_trace(go.Heatmap(z=used, x=hour_labels, y=names, zmin=0, zmax=100, colorscale="Viridis",
                                colorbar={"title": "%", "y": 0.22, "len": 0.45}, hoverongaps=False,
                                hovertemplate="%{y}<br>%{x}<br>used %{z}%<extra></extra>"), row=2, col=1)
    figure.update_layout(height=260 + 40 * len(names), margin={"l": 10, "r": 10, "t": 40, "b": 10})
    return figure


def idle_figure(report: IdleReport) -> go.Figure:
    figure = go.Figure()
    for team in sorted({group.team for group in report.by_user}):
        users = [group for group in report.by_user if group.team == team]
        figure.add_trace(go.Bar(name=team, x=[group.user for group in users],
                                y=[round(group.wasted_gpu_hours, 2) for group in users],
                                hovertemplate="%{x}: %{y} GPU-hours idle<extra>" + team + "</extra>"))
    figure.update_layout(barmode="group", yaxis_title="GPU-hours booked but idle", height=380,
                         margin={"l": 10, "r": 10, "t": 20, "b": 10})
    return figure


def quota_figure(rows: list[QuotaRow]) -> go.Figure:
    teams = [row.team for row in rows]
    figure = go.Figure()
    for name, values, colour in (
        ("reserved", [row.reserved_gpu_hours for row in rows], "#1f77b4"),
        ("backfill (× usage factor)", [row.backfill_gpu_hours for row in rows], "#9467bd"),
        ("remaining", [row.remaining_gpu_hours for row in rows], "#d9d9d9"),
    ):
        figure.add_trace(go.Bar(name=name, x=teams, y=[round(value, 2) for value in values], marker_color=colour))
    figure.add_trace(go.Scatter(name="quota", x=teams, y=[row.quota_gpu_hours for row in rows], mode="markers",
                                marker={"symbol": "line-ew-open", "size": 40, "color": "black"}))
    figure.add_trace(go.Scatter(name="month-end forecast", x=teams, mode="markers",
                                y=[None if row.forecast_gpu_hours is None else round(row.forecast_gpu_hours, 2)
                                   for row in rows],
                                marker={"symbol": "diamond", "size": 12, "color": "#d62728"}))
    figure.update_layout(barmode="stack", yaxis_title="GPU-hours", height=400,
                         margin={"l": 10, "r": 10, "t": 20, "b": 10})
    return figure
