"""Reads. Every function takes what it needs as keyword arguments; none writes."""

import dataclasses
import datetime as dt
from collections import defaultdict
from collections.abc import Iterable

from django.apps import apps
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import DurationField, ExpressionWrapper, F, Q, QuerySet, Sum, Value
from django.db.models.functions import Greatest, Least

from gpus.models import Gpu, MaintenanceWindow
from reservations import timegrid
from reservations.models import Membership, Reservation, ReservationGpu, Team


def user_team_roles(*, user: AbstractBaseUser) -> dict[int, str]:
    """{team id: role} for the user's memberships."""
    return dict(Membership.objects.filter(user=user).values_list("team_id", "role"))


def user_can_manage_team(*, user: AbstractBaseUser, team_id: int) -> bool:
    if user.is_superuser:
        return True
    return Membership.objects.filter(user=user, team_id=team_id, role=Membership.Role.MANAGER).exists()


def teams_visible_to(*, user: AbstractBaseUser) -> QuerySet[Team]:
    if user.is_superuser:
        return Team.objects.all()
    return Team.objects.filter(memberships__user=user)


def reservations_visible_to(*, user: AbstractBaseUser) -> QuerySet[Reservation]:
    """A user sees their teams' reservations in full; admins see everything."""
    queryset = Reservation.objects.all()
    if not user.is_superuser:
        queryset = queryset.filter(team__in=Team.objects.filter(memberships__user=user))
    return queryset


def usage_seconds(
    *,
    team: Team,
    window_start: dt.datetime,
    window_end: dt.datetime,
    user_id: int | None = None,
    exclude_reservation_id: int | None = None,
) -> int:
    """GPU-seconds the team (or one of its users) has booked inside [window_start, window_end).

    Occupying reservations count their overlap with the window; a cancelled one counts
    nothing and an early-released one counts only up to its new end — that is the refund.
    """
    rows = Reservation.objects.filter(
        team=team, status__in=Reservation.OCCUPYING, start__lt=window_end, end__gt=window_start
    )
    if user_id is not None:
        rows = rows.filter(user_id=user_id)
    if exclude_reservation_id is not None:
        rows = rows.exclude(pk=exclude_reservation_id)
    # Summed in the database, grouped by GPU count (SQLite cannot multiply a duration):
    # a team's month can hold thousands of bookings, and this runs inside the booking lock.
    overlap = ExpressionWrapper(
        Least(F("end"), Value(window_end)) - Greatest(F("start"), Value(window_start)), output_field=DurationField()
    )
    groups = rows.order_by().values("gpu_count").annotate(total=Sum(overlap))
    return sum(group["gpu_count"] * round(group["total"].total_seconds()) for group in groups)


# --- the quota position: one rule, read by everyone -------------------------------------------
# The booking check, the scheduler's snapshot, the reports, the calendar bar, the admin bar,
# /metrics and the API all read a team's month through `quota_positions`, and colour it with
# these two lines (the same ones the quota notices use).
QUOTA_WARNING_PERCENT = 80
QUOTA_EXHAUSTED_PERCENT = 100


@dataclasses.dataclass(frozen=True)
class QuotaPosition:
    """A team's calendar month (in the team's time zone), in GPU-seconds.

    Everything the team uses counts: bookings at their GPU-hours (slots still ahead included,
    cancelled ones not, released ones up to their new end) and backfill runs at the backfill
    usage factor (running ones up to `now`)."""

    team_id: int
    time_zone: str
    month: str  # YYYY-MM in the team's zone
    month_start: dt.datetime
    month_end: dt.datetime
    quota_gpu_s: float
    booked_gpu_s: float
    booked_to_date_gpu_s: float  # the part of the bookings before now
    backfill_gpu_s: float  # backfill charged, at the usage factor

    @property
    def used_gpu_s(self) -> float:
        return self.booked_gpu_s + self.backfill_gpu_s

    @property
    def remaining_gpu_s(self) -> float:
        return max(0.0, self.quota_gpu_s - self.used_gpu_s)

    quota_gpu_hours = property(lambda self: self.quota_gpu_s / 3600)
    booked_gpu_hours = property(lambda self: self.booked_gpu_s / 3600)
    booked_to_date_gpu_hours = property(lambda self: self.booked_to_date_gpu_s / 3600)
    backfill_gpu_hours = property(lambda self: self.backfill_gpu_s / 3600)
    used_gpu_hours = property(lambda self: self.used_gpu_s / 3600)
    remaining_gpu_hours = property(lambda self: self.remaining_gpu_s / 3600)

    @property
    def percent(self) -> int:
        """Share of the quota used, 0–100 (a team without quota that used anything: 100)."""
        if not self.quota_gpu_s:
            return 100 if self.used_gpu_s else 0
        return min(100, round(100 * self.used_gpu_s / self.quota_gpu_s))

    @property
    def crossed_percent(self) -> int:
        """The highest threshold line reached: 0, QUOTA_WARNING_PERCENT or QUOTA_EXHAUSTED_PERCENT."""
        if not self.quota_gpu_s:
            return 0
        for line in (QUOTA_EXHAUSTED_PERCENT, QUOTA_WARNING_PERCENT):
            if self.used_gpu_s >= self.quota_gpu_s * line / 100:
                return line
        return 0

    @property
    def level(self) -> str:
        """`ok`, `warning` or `exhausted`: what the bars colour."""
        if not self.quota_gpu_s:
            return "exhausted" if self.used_gpu_s else "ok"
        return {QUOTA_EXHAUSTED_PERCENT: "exhausted", QUOTA_WARNING_PERCENT: "warning"}.get(self.crossed_percent, "ok")

    def as_dict(self) -> dict:
        """The API's (and the notices') shape, in GPU-hours rounded to 0.01."""
        return {
            "month": self.month,
            "quota_gpu_hours": round(self.quota_gpu_hours, 2),
            "booked_gpu_hours": round(self.booked_gpu_hours, 2),
            "backfill_gpu_hours": round(self.backfill_gpu_hours, 2),
            "used_gpu_hours": round(self.used_gpu_hours, 2),
            "remaining_gpu_hours": round(self.remaining_gpu_hours, 2),
        }


def month_window(*, team: Team, at: dt.datetime | None = None, year: int | None = None,
                 month: int | None = None) -> tuple[dt.datetime, dt.datetime]:
    """[start, end) in UTC of the team's calendar month containing `at`, or `year`-`month`."""
    tz = team.tzinfo
    if year is not None and month is not None:
        start = dt.datetime(year, month, 1, tzinfo=tz)
        return start.astimezone(dt.UTC), timegrid.next_month_start(start, tz)
    if at is None:
        raise ValueError("month_window needs `at` or `year` and `month`")
    return timegrid.month_start(at, tz), timegrid.next_month_start(at, tz)


def _booked_seconds(
    *, team_ids: list[int], window_start: dt.datetime, window_end: dt.datetime, now: dt.datetime,
    exclude_reservation_id: int | None,
) -> tuple[dict[int, float], dict[int, float]]:
    """{team id: booked GPU-seconds in the window}, and the part of it before `now`. One query,
    summed in the database by team and GPU count (SQLite cannot multiply a duration): a team's
    month can hold thousands of bookings, and the booking check runs inside the booking lock."""
    rows = Reservation.objects.filter(
        team_id__in=team_ids, status__in=Reservation.OCCUPYING, start__lt=window_end, end__gt=window_start
    )
    if exclude_reservation_id is not None:
        rows = rows.exclude(pk=exclude_reservation_id)
    overlap = ExpressionWrapper(
        Least(F("end"), Value(window_end)) - Greatest(F("start"), Value(window_start)), output_field=DurationField()
    )
    sums = {"total": Sum(overlap)}
    cutoff = min(window_end, now)
    if cutoff > window_start:  # only then is every overlap with [window_start, cutoff) positive
        sums["to_date"] = Sum(
            ExpressionWrapper(
                Least(F("end"), Value(cutoff)) - Greatest(F("start"), Value(window_start)),
                output_field=DurationField(),
            ),
            filter=Q(start__lt=cutoff),
        )
    booked: dict[int, float] = defaultdict(float)
    to_date: dict[int, float] = defaultdict(float)
    for group in rows.order_by().values("team_id", "gpu_count").annotate(**sums):
        booked[group["team_id"]] += group["gpu_count"] * round(group["total"].total_seconds())
        if group.get("to_date") is not None:
            to_date[group["team_id"]] += group["gpu_count"] * round(group["to_date"].total_seconds())
    return booked, to_date


def _backfill_charged_seconds(
    *, windows: dict[int, tuple[dt.datetime, dt.datetime]], now: dt.datetime
) -> dict[int, float]:
    """{team id: GPU-seconds of its backfill runs inside its window, at the usage factor};
    a running run counts up to `now`. One query. Runs are `training`'s table, read through
    the app registry as /metrics does: this room sits below training and imports none of it."""
    run_model = apps.get_model("training", "Run")
    factor = settings.GPUBOOK_BACKFILL_USAGE_FACTOR
    earliest = min(start for start, _ in windows.values())
    latest = max(end for _, end in windows.values())
    charged: dict[int, float] = defaultdict(float)
    for team_id, started, ended, gpu_ids in (
        run_model.objects.filter(
            job__team_id__in=list(windows), kind="backfill", started_at__isnull=False,
            started_at__lt=min(latest, now),
        )
        .exclude(ended_at__lte=earliest)
        .values_list("job__team_id", "started_at", "ended_at", "gpu_ids")
    ):
        window_start, window_end = windows[team_id]
        end = min(ended or now, now, window_end)
        charged[team_id] += len(gpu_ids) * factor * max(0.0, (end - max(started, window_start)).total_seconds())
    return charged


def quota_positions(
    *,
    teams: Iterable[Team],
    now: dt.datetime,
    year: int | None = None,
    month: int | None = None,
    at: dt.datetime | None = None,
    exclude_reservation_id: int | None = None,
) -> dict[int, QuotaPosition]:
    """{team id: its QuotaPosition} for the team's month containing `at` (default `now`), or
    for `year`-`month` (each team's own zone). Queries: one per distinct month window among
    the teams (one, unless their zones differ) for bookings, one for backfill runs.
    `exclude_reservation_id` leaves one booking out (a reschedule checks without itself)."""
    teams = list(teams)
    if not teams:
        return {}
    windows = {team.pk: month_window(team=team, at=at or now, year=year, month=month) for team in teams}
    booked: dict[int, float] = {}
    to_date: dict[int, float] = {}
    for window in sorted(set(windows.values())):
        team_ids = [team_id for team_id, team_window in windows.items() if team_window == window]
        in_window, before_now = _booked_seconds(
            team_ids=team_ids, window_start=window[0], window_end=window[1], now=now,
            exclude_reservation_id=exclude_reservation_id,
        )
        booked.update(in_window)
        to_date.update(before_now)
    backfill = _backfill_charged_seconds(windows=windows, now=now)
    positions = {}
    for team in teams:
        window_start, window_end = windows[team.pk]
        positions[team.pk] = QuotaPosition(
            team_id=team.pk,
            time_zone=team.time_zone,
            month=window_start.astimezone(team.tzinfo).strftime("%Y-%m"),
            month_start=window_start,
            month_end=window_end,
            quota_gpu_s=float(team.monthly_gpu_hours * 3600),
            booked_gpu_s=float(booked.get(team.pk, 0.0)),
            booked_to_date_gpu_s=float(to_date.get(team.pk, 0.0)),
            backfill_gpu_s=backfill.get(team.pk, 0.0),
        )
    return positions


def team_quota_position(
    *, team: Team, now: dt.datetime, at: dt.datetime | None = None, exclude_reservation_id: int | None = None
) -> QuotaPosition:
    """The team's quota position in its month containing `at` (default: this month)."""
    return quota_positions(teams=[team], now=now, at=at, exclude_reservation_id=exclude_reservation_id)[team.pk]


def conflicting_bookings(
    *,
    gpu_ids: Iterable[int],
    start: dt.datetime,
    end: dt.datetime,
    exclude_reservation_id: int | None = None,
) -> list[ReservationGpu]:
    rows = (
        ReservationGpu.objects.filter(gpu_id__in=list(gpu_ids), occupies=True, start__lt=end, end__gt=start)
        .select_related("reservation__team", "reservation__user")
        .order_by("start", "gpu_id")
    )
    if exclude_reservation_id is not None:
        rows = rows.exclude(reservation_id=exclude_reservation_id)
    return list(rows)


def maintenance_overlapping(
    *, node_id: int, gpu_ids: Iterable[int], start: dt.datetime, end: dt.datetime
) -> list[MaintenanceWindow]:
    return list(
        MaintenanceWindow.objects.filter(node_id=node_id, start__lt=end, end__gt=start)
        .filter(Q(gpus__isnull=True) | Q(gpus__in=list(gpu_ids)))
        .distinct()
    )


def free_windows(*, gpu_ids: list[int], start: dt.datetime, end: dt.datetime) -> list[tuple[dt.datetime, dt.datetime]]:
    """Windows inside [start, end) where every listed GPU is free of bookings and maintenance."""
    busy: list[tuple[dt.datetime, dt.datetime]] = [
        (max(row.start, start), min(row.end, end))
        for row in ReservationGpu.objects.filter(gpu_id__in=gpu_ids, occupies=True, start__lt=end, end__gt=start)
    ]
    node_ids = set(Gpu.objects.filter(pk__in=gpu_ids).values_list("node_id", flat=True))
    for node_id in node_ids:
        busy += [
            (max(window.start, start), min(window.end, end))
            for window in maintenance_overlapping(node_id=node_id, gpu_ids=gpu_ids, start=start, end=end)
        ]
    windows = []
    cursor = start
    for busy_start, busy_end in sorted(busy):
        if busy_start > cursor:
            windows.append((cursor, busy_start))
        cursor = max(cursor, busy_end)
    if cursor < end:
        windows.append((cursor, end))
    return windows
