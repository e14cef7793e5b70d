"""Conversion between the two kinds of `Instant` (aware datetimes and float seconds).

plan() works on float seconds inside, because comparing and adding floats is several times
cheaper than datetime arithmetic at thousands of jobs per tick; it converts once on the way
in and turns the times it emits back into the caller's kind on the way out.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from scheduler.snapshot import Instant

INFINITY = float("inf")


def to_seconds(instant: Instant) -> float:
    """Seconds since the epoch for a datetime; a float is already seconds."""
    if isinstance(instant, datetime):
        return instant.timestamp()
    return float(instant)


def optional_seconds(instant: Instant | None) -> float:
    """Like `to_seconds`, with None meaning "never" (infinitely far in the future)."""
    return INFINITY if instant is None else to_seconds(instant)


def converter_like(now: Instant) -> Callable[[float], Instant]:
    """A function turning plan-internal seconds back into the kind of `now`."""
    if isinstance(now, datetime):
        if now.tzinfo is None:
            raise ValueError("now must be timezone-aware (UTC); naive datetimes are ambiguous")
        return lambda seconds: datetime.fromtimestamp(seconds, tz=UTC)
    return float


def check_now(now: Instant) -> None:
    """Reject a naive datetime early: the DB stores UTC and a naive `now` hides a bug."""
    if isinstance(now, datetime) and now.tzinfo is None:
        raise ValueError("now must be timezone-aware (UTC); naive datetimes are ambiguous")
