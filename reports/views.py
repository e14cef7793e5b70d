"""Report pages and their CSV exports: parse the query, call one selector, render."""

import csv
import datetime as dt
import zoneinfo

from django.contrib.auth.decorators import login_required
from django.core.exceptions import ObjectDoesNotExist
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from reports import figures, selectors

DEFAULT_DAYS = 7


def _viewer_tz(request: HttpRequest) -> zoneinfo.ZoneInfo:
    try:
        return zoneinfo.ZoneInfo(request.user.profile.time_zone)
    except (ObjectDoesNotExist, zoneinfo.ZoneInfoNotFoundError, ValueError):  # no profile yet: UTC
        return zoneinfo.ZoneInfo("UTC")


EARLIEST_DATE, LATEST_DATE = dt.date(1970, 1, 1), dt.date(9000, 12, 31)


def _date_range(request: HttpRequest, tz: zoneinfo.ZoneInfo, *, now: dt.datetime,
                max_days: int) -> tuple[dt.datetime, dt.datetime, list[str]]:
    """`from` and `to` are dates (YYYY-MM-DD) in the viewer's zone, `to` inclusive."""
    problems = []
    today = now.astimezone(tz).date()

    def parse(name: str, default: dt.date) -> dt.date:
        raw = request.GET.get(name, "")
        if not raw:
            return default
        try:
            value = dt.date.fromisoformat(raw)
        except ValueError:
            problems.append(f"“{raw[:40]}” is not a date (YYYY-MM-DD); showing the default.")
            return default
        if not EARLIEST_DATE <= value <= LATEST_DATE:  # date arithmetic past year 9999 overflows
            problems.append(f"Dates run from {EARLIEST_DATE} to {LATEST_DATE}; showing the default.")
            return default
        return value

    last = parse("to", today)
    first = parse("from", last - dt.timedelta(days=DEFAULT_DAYS - 1))
    if first > last:
        problems.append("The range ends before it starts; showing the default.")
        last, first = today, today - dt.timedelta(days=DEFAULT_DAYS - 1)
    if (last - first).days + 1 > max_days:
        problems.append(f"At most {max_days} days at a time; the range was shortened.")
        first = last - dt.timedelta(days=max_days - 1)
    start = dt.datetime.combine(first, dt.time(), tzinfo=tz).astimezone(dt.UTC)
    end = dt.datetime.combine(last + dt.timedelta(days=1), dt.time(), tzinfo=tz).astimezone(dt.UTC)
    return start, end, problems


def _csv_response(filename: str, header: list[str], rows) -> HttpResponse:
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    writer = csv.writer(response)
    writer.writerow(header)
    writer.writerows(rows)
    return response


def _percent(value: float | None) -> str:
    return "" if value is None else f"{value * 100:.1f}"


@login_required
@require_GET
def index(request: HttpRequest) -> HttpResponse:
    return render(request, "reports/index.html", {"nav": "reports"})


@login_required
@require_GET
def utilization(request: HttpRequest, as_csv: bool = False) -> HttpResponse:
    now = timezone.now()
    tz = _viewer_tz(request)
    start, end, problems = _date_range(request, tz, now=now, max_days=selectors.MAX_HEATMAP_RANGE.days)
    heatmap = selectors.utilization_heatmap(start=start, end=end)
    labels = [hour.astimezone(tz).strftime("%Y-%m-%d %H:%M") for hour in heatmap.hours]
    if as_csv:
        rows = (
            [gpu.node.name, gpu.index, gpu.uuid, hour.isoformat(), label, _percent(booked), _percent(used)]
            for gpu, booked_row, used_row in zip(heatmap.gpus, heatmap.booked, heatmap.used, strict=True)
            for hour, label, booked, used in zip(heatmap.hours, labels, booked_row, used_row, strict=True)
        )
        return _csv_response("utilization.csv", ["node", "gpu", "uuid", "hour_utc", f"hour_{tz.key}",
                                                 "booked_percent", "used_percent"], rows)
    figure = figures.to_html(figures.heatmap_figure(heatmap, hour_labels=labels), element_id="utilization-heatmap")
    return render(request, "reports/utilization.html", {
        "nav": "reports", "figure": figure, "problems": problems, "heatmap": heatmap, "tz": tz.key,
        "from": start.astimezone(tz).date(), "to": (end - dt.timedelta(seconds=1)).astimezone(tz).date(),
        "plotly_version": figures.PLOTLY_VERSION,
    })


def _ratio_param(request: HttpRequest, name: str, default: float, problems: list[str]) -> float:
    raw = request.GET.get(name, "")
    if not raw:
        return default
    try:
        value = float(raw) / 100
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        problems.append(f"`{name}` must be a percentage between 1 and 100; using {default * 100:g}.")
        return default
    return value


@login_required
@require_GET
def idle(request: HttpRequest, as_csv: bool = False) -> HttpResponse:
    now = timezone.now()
    tz = _viewer_tz(request)
    start, end, problems = _date_range(request, tz, now=now, max_days=92)
    threshold = _ratio_param(request, "threshold", selectors.DEFAULT_IDLE_THRESHOLD, problems)
    share = _ratio_param(request, "share", selectors.DEFAULT_IDLE_SHARE, problems)
    report = selectors.idle_bookings(user=request.user, start=start, end=end, now=now,
                                     threshold=threshold, share=share)
    if as_csv:
        rows = (
            [item.reservation.pk, item.reservation.team.name, item.reservation.user.get_username(),
             item.reservation.node.name, item.reservation.gpu_count, item.reservation.start.isoformat(),
             item.reservation.end.isoformat(), item.reservation.status,
             f"{item.observed_gpu_minutes / 60:.2f}", f"{item.measured_gpu_minutes / 60:.2f}",
             f"{item.wasted_gpu_hours:.2f}", f"{item.idle_share * 100:.1f}"]
            for item in report.bookings
        )
        return _csv_response("idle-bookings.csv", [
            "reservation", "team", "user", "node", "gpus", "start_utc", "end_utc", "status",
            "booked_gpu_hours", "measured_gpu_hours", "idle_gpu_hours", "idle_percent",
        ], rows)
    return render(request, "reports/idle.html", {
        "nav": "reports", "report": report, "problems": problems, "tz": tz.key,
        "figure": figures.to_html(figures.idle_figure(report), element_id="idle-by-user") if report.bookings else "",
        "from": start.astimezone(tz).date(), "to": (end - dt.timedelta(seconds=1)).astimezone(tz).date(),
        "threshold_percent": round(threshold * 100), "share_percent": round(share * 100),
        "total_wasted": sum(group.wasted_gpu_hours for group in report.by_team),
        "plotly_version": figures.PLOTLY_VERSION,
    })


@login_required
@require_GET
def quota(request: HttpRequest, as_csv: bool = False) -> HttpResponse:
    now = timezone.now()
    problems = []
    year = month = None
    raw = request.GET.get("month", "")
    if raw:
        try:
            parsed = dt.datetime.strptime(raw, "%Y-%m")
            year, month = parsed.year, parsed.month
        except ValueError:
            problems.append(f"“{raw}” is not a month (YYYY-MM); showing the current month.")
    rows = selectors.quota_report(user=request.user, now=now, year=year, month=month)
    if as_csv:
        return _csv_response("quota.csv", [
            "team", "month", "time_zone", "quota_gpu_hours", "reserved_gpu_hours", "backfill_gpu_hours",
            "used_gpu_hours", "remaining_gpu_hours", "forecast_gpu_hours",
        ], (
            [row.team, row.month, row.time_zone, f"{row.quota_gpu_hours:.2f}", f"{row.reserved_gpu_hours:.2f}",
             f"{row.backfill_gpu_hours:.2f}", f"{row.used_gpu_hours:.2f}", f"{row.remaining_gpu_hours:.2f}",
             "" if row.forecast_gpu_hours is None else f"{row.forecast_gpu_hours:.2f}"]
            for row in rows
        ))
    return render(request, "reports/quota.html", {
        "nav": "reports", "rows": rows, "problems": problems, "month": raw or (rows[0].month if rows else ""),
        "figure": figures.to_html(figures.quota_figure(rows), element_id="quota-by-team") if rows else "",
        "plotly_version": figures.PLOTLY_VERSION,
    })
