"""Report figures. Reads only; each function runs a fixed, small number of queries whatever
the size of the range (the view tests pin them), and returns plain data the views draw.

Units: ratios 0–1 and GPU-hours. Times are UTC; views label them in the viewer's zone.
"""

import dataclasses
import datetime as dt
from collections import defaultdict

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Avg, Count, F, Q
from django.db.models.functions import TruncHour

from gpus.models import Gpu, GpuSample
from reservations import selectors as reservation_selectors
from reservations import timegrid
from reservations.models import Reservation, ReservationGpu
from training.models import Run

HOUR = dt.timedelta(hours=1)
MAX_HEATMAP_RANGE = dt.timedelta(days=31)
# An idle booking is one whose GPUs stayed under the threshold for at least this share of
# the slot's GPU-minutes ("most of the slot").
DEFAULT_IDLE_SHARE = 0.5
DEFAULT_IDLE_THRESHOLD = 0.10


def _overlap_s(start, end, window_start, window_end) -> float:
    return max(0.0, (min(end, window_end) - max(start, window_start)).total_seconds())


# --- utilization heatmap -------------------------------------------------------------------------
@dataclasses.dataclass
class Heatmap:
    gpus: list[Gpu]
    hours: list[dt.datetime]  # UTC hour starts
    booked: list[list[float]]  # [gpu][hour] share of the hour booked, 0–1
    used: list[list[float | None]]  # [gpu][hour] mean utilization over minutes with telemetry; None: none


def utilization_heatmap(*, start: dt.datetime, end: dt.datetime) -> Heatmap:
    """GPU × hour over [start, end) (whole UTC hours). Three queries: GPUs, bookings, telemetry."""
    first = start.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)
    hours = []
    cursor = first
    while cursor < end:
        hours.append(cursor)
        cursor += HOUR
    last = hours[-1] + HOUR if hours else first
    gpus = list(Gpu.objects.select_related("node").order_by("node__name", "index"))
    position = {gpu.pk: row for row, gpu in enumerate(gpus)}
    booked = [[0.0] * len(hours) for _ in gpus]
    used: list[list[float | None]] = [[None] * len(hours) for _ in gpus]
    for gpu_id, booked_start, booked_end in ReservationGpu.objects.filter(
        occupies=True, start__lt=last, end__gt=first
    ).values_list("gpu_id", "start", "end"):
        row = position.get(gpu_id)
        if row is None:
            continue
        begin = max(0, int((booked_start - first).total_seconds() // 3600))
        for column in range(begin, len(hours)):
            if hours[column] >= booked_end:
                break
            booked[row][column] += _overlap_s(booked_start, booked_end, hours[column], hours[column] + HOUR) / 3600
    samples = (
        GpuSample.objects.filter(minute__gte=first, minute__lt=last, utilization_mean__isnull=False)
        .annotate(hour=TruncHour("minute", tzinfo=dt.UTC))
        .values("gpu_id", "hour")
        .annotate(mean=Avg("utilization_mean"))
        .order_by()
    )
    for item in samples:
        row = position.get(item["gpu_id"])
        column = int((item["hour"] - first).total_seconds() // 3600)
        if row is not None and 0 <= column < len(hours):
            used[row][column] = float(item["mean"])
    booked = [[min(1.0, value) for value in row] for row in booked]
    return Heatmap(gpus=gpus, hours=hours, booked=booked, used=used)


# --- booked but idle -----------------------------------------------------------------------------
@dataclasses.dataclass
class IdleBooking:
    reservation: Reservation
    observed_gpu_minutes: int  # GPU-minutes of the slot so far (up to now)
    measured_gpu_minutes: int  # of which telemetry covers
    idle_gpu_minutes: int  # of which were under the threshold

    @property
    def idle_share(self) -> float:
        return self.idle_gpu_minutes / self.observed_gpu_minutes if self.observed_gpu_minutes else 0.0

    @property
    def wasted_gpu_hours(self) -> float:
        return self.idle_gpu_minutes / 60


@dataclasses.dataclass
class IdleGroup:
    team: str
    user: str  # "" for a team total
    bookings: int = 0
    booked_gpu_hours: float = 0.0
    wasted_gpu_hours: float = 0.0


@dataclasses.dataclass
class IdleReport:
    bookings: list[IdleBooking]  # the idle ones, most wasteful first
    by_team: list[IdleGroup]
    by_user: list[IdleGroup]
    threshold: float
    share: float


def idle_bookings(
    *,
    user: AbstractBaseUser,
    start: dt.datetime,
    end: dt.datetime,
    now: dt.datetime,
    threshold: float = DEFAULT_IDLE_THRESHOLD,
    share: float = DEFAULT_IDLE_SHARE,
) -> IdleReport:
    """Bookings the user may see that began in [start, end) and whose GPUs stayed under
    `threshold` utilization for at least `share` of the slot's GPU-minutes so far. Minutes
    without telemetry are not idle (unknown is not idle). Two queries."""
    candidates = {
        reservation.pk: reservation
        for reservation in reservation_selectors.reservations_visible_to(user=user)
        .filter(
            status__in=(Reservation.Status.ACTIVE, Reservation.Status.COMPLETED, Reservation.Status.RELEASED),
            start__gte=start, start__lt=min(end, now),
        )
        .select_related("team", "user", "node")
        .order_by("start", "id")
    }
    figures = (
        GpuSample.objects.filter(
            gpu__booked__reservation_id__in=list(candidates), gpu__booked__occupies=True,
            minute__gte=F("gpu__booked__start"), minute__lt=F("gpu__booked__end"),
            utilization_mean__isnull=False,
        )
        .filter(minute__lt=now)
        .values("gpu__booked__reservation_id")
        .annotate(measured=Count("id"), idle=Count("id", filter=Q(utilization_mean__lt=threshold)))
        .order_by()
    ) if candidates else []
    per_reservation = {item["gpu__booked__reservation_id"]: item for item in figures}
    flagged = []
    for reservation_id, reservation in candidates.items():
        item = per_reservation.get(reservation_id, {"measured": 0, "idle": 0})
        slot_end = min(reservation.end, now)
        observed = reservation.gpu_count * int((slot_end - reservation.start).total_seconds() // 60)
        booking = IdleBooking(reservation, observed, item["measured"], item["idle"])
        if observed and booking.idle_share >= share:
            flagged.append(booking)
    flagged.sort(key=lambda item: (-item.idle_gpu_minutes, item.reservation.start, item.reservation.pk))
    teams: dict[str, IdleGroup] = {}
    users: dict[tuple[str, str], IdleGroup] = {}
    for booking in flagged:
        reservation = booking.reservation
        team_name, username = reservation.team.name, reservation.user.get_username()
        for group in (
            teams.setdefault(team_name, IdleGroup(team=team_name, user="")),
            users.setdefault((team_name, username), IdleGroup(team=team_name, user=username)),
        ):
            group.bookings += 1
            group.booked_gpu_hours += booking.observed_gpu_minutes / 60
            group.wasted_gpu_hours += booking.wasted_gpu_hours

    def order(group):
        return (-group.wasted_gpu_hours, group.team, group.user)

    return IdleReport(
        bookings=flagged, by_team=sorted(teams.values(), key=order), by_user=sorted(users.values(), key=order),
        threshold=threshold, share=share,
    )


# --- quota ---------------------------------------------------------------------------------------
@dataclasses.dataclass
class QuotaRow:
    team_id: int
    team: str
    time_zone: str
    month: str  # YYYY-MM in the team's zone
    month_start: dt.datetime
    month_end: dt.datetime
    quota_gpu_hours: float
    reserved_gpu_hours: float  # booked in the month (all of it, including slots still ahead)
    reserved_to_date_gpu_hours: float  # the part of it before now
    backfill_gpu_hours: float  # backfill runs, at the usage factor (running ones up to now)
    forecast_gpu_hours: float | None  # expected month-end use; None for a month not begun

    @property
    def used_gpu_hours(self) -> float:
        return self.reserved_gpu_hours + self.backfill_gpu_hours

    @property
    def remaining_gpu_hours(self) -> float:
        return max(0.0, self.quota_gpu_hours - self.used_gpu_hours)

    @property
    def forecast_over_quota(self) -> bool:
        return self.forecast_gpu_hours is not None and self.forecast_gpu_hours > self.quota_gpu_hours


def month_window(*, year: int, month: int, tz) -> tuple[dt.datetime, dt.datetime]:
    start = dt.datetime(year, month, 1, tzinfo=tz)
    return start.astimezone(dt.UTC), timegrid.next_month_start(start, tz)


def forecast_gpu_hours(
    *, month_start: dt.datetime, month_end: dt.datetime, now: dt.datetime,
    consumed_to_date: float, booked_ahead: float,
) -> float | None:
    """Month-end use from the burn rate: what was consumed so far, plus the larger of what is
    already booked for the rest of the month and the rest of the month at this month's pace
    (consumed ÷ elapsed). A past month forecasts its actual use; a month not begun, None."""
    if now >= month_end:
        return consumed_to_date + booked_ahead
    if now <= month_start:
        return None
    elapsed = (now - month_start).total_seconds()
    rate = consumed_to_date / elapsed
    return consumed_to_date + max(booked_ahead, rate * (month_end - now).total_seconds())


def quota_report(
    *, user: AbstractBaseUser, now: dt.datetime, year: int | None = None, month: int | None = None
) -> list[QuotaRow]:
    """Each visible team's month (`year`/`month` in the team's own zone; default: the month
    containing now). Three queries: teams, bookings, backfill runs."""
    factor = float(getattr(settings, "GPUBOOK_BACKFILL_USAGE_FACTOR", 0.5))
    teams = list(reservation_selectors.teams_visible_to(user=user).order_by("name"))
    if not teams:
        return []
    windows = {}
    for team in teams:
        if year is None or month is None:
            windows[team.pk] = (timegrid.month_start(now, team.tzinfo), timegrid.next_month_start(now, team.tzinfo))
        else:
            windows[team.pk] = month_window(year=year, month=month, tz=team.tzinfo)
    earliest = min(start for start, _ in windows.values())
    latest = max(end for _, end in windows.values())
    reserved = defaultdict(float)
    reserved_to_date = defaultdict(float)
    for team_id, start, end, count in Reservation.objects.filter(
        team__in=[team.pk for team in teams], status__in=Reservation.OCCUPYING, start__lt=latest, end__gt=earliest,
    ).values_list("team_id", "start", "end", "gpu_count"):
        window_start, window_end = windows[team_id]
        reserved[team_id] += count * _overlap_s(start, end, window_start, window_end)
        reserved_to_date[team_id] += count * _overlap_s(start, end, window_start, min(window_end, now))
    backfill = defaultdict(float)
    for team_id, started, ended, gpu_ids in Run.objects.filter(
        job__team__in=[team.pk for team in teams], kind=Run.Kind.BACKFILL, started_at__isnull=False,
        started_at__lt=min(latest, now),
    ).exclude(ended_at__lte=earliest).values_list("job__team_id", "started_at", "ended_at", "gpu_ids"):
        window_start, window_end = windows[team_id]
        backfill[team_id] += len(gpu_ids) * factor * _overlap_s(started, ended or now, window_start, window_end)
    rows = []
    for team in teams:
        window_start, window_end = windows[team.pk]
        consumed = (reserved_to_date[team.pk] + backfill[team.pk]) / 3600
        booked_ahead = (reserved[team.pk] - reserved_to_date[team.pk]) / 3600
        rows.append(
            QuotaRow(
                team_id=team.pk, team=team.name, time_zone=team.time_zone,
                month=window_start.astimezone(team.tzinfo).strftime("%Y-%m"),
                month_start=window_start, month_end=window_end,
                quota_gpu_hours=float(team.monthly_gpu_hours),
                reserved_gpu_hours=reserved[team.pk] / 3600,
                reserved_to_date_gpu_hours=reserved_to_date[team.pk] / 3600,
                backfill_gpu_hours=backfill[team.pk] / 3600,
                forecast_gpu_hours=forecast_gpu_hours(
                    month_start=window_start, month_end=window_end, now=now,
                    consumed_to_date=consumed, booked_ahead=booked_ahead,
                ),
            )
        )
    return rows
