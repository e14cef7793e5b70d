"""Slot grid and calendar arithmetic. Pure functions over aware datetimes; no clock reads."""

import datetime as dt
import math
import zoneinfo

UTC = dt.UTC


def is_aware(value: dt.datetime) -> bool:
    return value.tzinfo is not None and value.tzinfo.utcoffset(value) is not None


def is_on_grid(value: dt.datetime, *, slot_minutes: int) -> bool:
    """Slots are aligned in absolute time (UTC), so a slot edge is an edge in every zone
    whose offset is a multiple of the slot size."""
    seconds = value.timestamp()
    return seconds == int(seconds) and int(seconds) % (slot_minutes * 60) == 0


def floor_to_slot(value: dt.datetime, *, slot_minutes: int) -> dt.datetime:
    step = slot_minutes * 60
    return dt.datetime.fromtimestamp(int(value.timestamp()) // step * step, tz=UTC)


def ceil_to_slot(value: dt.datetime, *, slot_minutes: int) -> dt.datetime:
    step = slot_minutes * 60
    seconds = math.ceil(value.timestamp())
    return dt.datetime.fromtimestamp(-(-seconds // step) * step, tz=UTC)


def month_start(value: dt.datetime, tz: zoneinfo.ZoneInfo) -> dt.datetime:
    """Start (UTC) of the calendar month in `tz` that contains `value`."""
    local = value.astimezone(tz)
    return dt.datetime(local.year, local.month, 1, tzinfo=tz).astimezone(UTC)


def next_month_start(value: dt.datetime, tz: zoneinfo.ZoneInfo) -> dt.datetime:
    local = value.astimezone(tz)
    year, month = (local.year + 1, 1) if local.month == 12 else (local.year, local.month + 1)
    return dt.datetime(year, month, 1, tzinfo=tz).astimezone(UTC)


def day_start(value: dt.datetime, tz: zoneinfo.ZoneInfo) -> dt.datetime:
    local = value.astimezone(tz)
    return dt.datetime(local.year, local.month, local.day, tzinfo=tz).astimezone(UTC)


def next_day_start(value: dt.datetime, tz: zoneinfo.ZoneInfo) -> dt.datetime:
    local = value.astimezone(tz).date() + dt.timedelta(days=1)
    return dt.datetime(local.year, local.month, local.day, tzinfo=tz).astimezone(UTC)


def overlap_seconds(
    start: dt.datetime, end: dt.datetime, window_start: dt.datetime, window_end: dt.datetime
) -> int:
    return max(0, int((min(end, window_end) - max(start, window_start)).total_seconds()))


def split_by_period(
    start: dt.datetime,
    end: dt.datetime,
    tz: zoneinfo.ZoneInfo,
    *,
    period_start=month_start,
    next_period_start=next_month_start,
) -> list[tuple[dt.datetime, dt.datetime]]:
    """The calendar periods (months by default, in `tz`) that [start, end) touches, as
    (period start, period end) pairs in UTC. Elapsed real time is what counts, so a
    booking over a DST change is charged its true length."""
    periods = []
    cursor = period_start(start, tz)
    while cursor < end:
        following = next_period_start(cursor, tz)
        periods.append((cursor, following))
        cursor = following
    return periods
