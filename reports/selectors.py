"""Report figures. Reads only; each function runs a fixed, small number of queries whatever
the size of the range (the view tests pin them), and returns plain data the views draw.

Units: ratios 0–1 and GPU-hours. Times are UTC; views label them in the viewer's zone.
"""

import dataclasses
import datetime as dt

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, DateTimeField, DurationField, ExpressionWrapper, F, Q, QuerySet, Sum, Value
from django.db.models.functions import Greatest, Least, TruncHour

from gpus.models import IDLE_GRID_PERCENTS, Gpu, GpuHourSummary, GpuSample
from reservations import selectors as reservation_selectors
from reservations.models import Reservation, ReservationGpu

HOUR = dt.timedelta(hours=1)
TICK = dt.timedelta(microseconds=1)  # the smallest step of a datetime: ceil(t) = floor(t - TICK) + 1 h
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
    # Whole hours only, so the hourly roll-up answers all of it (kept current by every batch
    # stored). The hour comes back as its offset from `first`: a month of GPU-hours is ~46,000
    # rows, and loading an interval costs a fifth of loading a timestamp.
    offset = ExpressionWrapper(F("hour") - Value(first), output_field=DurationField())
    for gpu_id, since_first, samples, total in GpuHourSummary.objects.filter(
        hour__gte=first, hour__lt=last, samples__gt=0
    ).annotate(since_first=offset).values_list("gpu_id", "since_first", "samples", "sum_utilization").order_by():
        row = position.get(gpu_id)
        column = int(since_first.total_seconds() // 3600)
        if row is not None and 0 <= column < len(hours):
            used[row][column] = total / samples
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
    chosen = reservation_selectors.reservations_visible_to(user=user).filter(
        status__in=(Reservation.Status.ACTIVE, Reservation.Status.COMPLETED, Reservation.Status.RELEASED),
        start__gte=start, start__lt=min(end, now),
    )
    candidates = {
        reservation.pk: reservation
        for reservation in chosen.select_related("team", "user", "node")
        # What the report, its page and CSV show: a month holds thousands of bookings.
        .only("start", "end", "gpu_count", "status", "team__name", "user__username", "node__name")
        .order_by("start", "id")
    }
    figures = _idle_minutes(
        reservations=chosen.values("pk"), threshold=threshold, start=start,
        end=min(now, max(reservation.end for reservation in candidates.values())),
    ) if candidates else {}
    flagged = []
    for reservation_id, reservation in candidates.items():
        measured, idle = figures.get(reservation_id, (0, 0))
        slot_end = min(reservation.end, now)
        observed = reservation.gpu_count * int((slot_end - reservation.start).total_seconds() // 60)
        booking = IdleBooking(reservation, observed, measured, idle)
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


def _grid_percent(threshold: float) -> int | None:
    """The roll-up's `under_K` column that counts exactly the minutes under `threshold`, if any."""
    percent = round(threshold * 100)
    return percent if percent in IDLE_GRID_PERCENTS and percent / 100 == threshold else None


def _idle_minutes(
    *, reservations: QuerySet, threshold: float, start: dt.datetime, end: dt.datetime
) -> dict[int, tuple[int, int]]:
    """Reservation id → (GPU-minutes with telemetry, of which under `threshold`) for the
    `reservations` (ids as a subquery: thousands of ids as parameters cost more to send than
    to count), counting each booked GPU's minutes in [max(its start, start), min(its end,
    end)). One round trip.

    On the roll-up's grid: whole UTC hours of that window from GpuHourSummary, and the minute
    buckets only for its partial first and last hours (`head`, `tail`, each at most an hour a
    GPU, disjoint by construction: a window inside one hour is all head). Off the grid: every
    minute from the buckets (exact, slower)."""
    booked = "gpu__booked__"
    joined = {f"{booked}reservation_id__in": reservations, f"{booked}occupies": True}
    # The window per booked GPU, as SQL over the joined row, and its whole hours [first, last).
    window_start = Greatest(F(f"{booked}start"), start)
    window_end = Least(F(f"{booked}end"), end)
    first_hour = TruncHour(ExpressionWrapper(window_start - TICK, output_field=DateTimeField()), tzinfo=dt.UTC) + HOUR
    last_hour = TruncHour(window_end, tzinfo=dt.UTC)
    util = "utilization_mean"

    def minutes(lower, upper):
        # One filter() call per part: a second call would join the booked GPUs a second time.
        # Bounds computed per joined row become the index range PostgreSQL reads.
        return GpuSample.objects.filter(
            **joined, minute__gte=lower, minute__lt=upper, **{f"{util}__isnull": False},
        ).values(f"{booked}reservation_id").annotate(
            measured=Count("id"), idle=Count("id", filter=Q(**{f"{util}__lt": threshold}))).order_by()

    percent = _grid_percent(threshold)
    if percent is None:
        query = minutes(window_start, window_end)
    else:
        rolled = GpuHourSummary.objects.filter(**joined, hour__gte=first_hour, hour__lt=last_hour).values(
            f"{booked}reservation_id").annotate(measured=Sum("samples"), idle=Sum(f"under_{percent}")).order_by()
        head = minutes(window_start, Least(first_hour, window_end))
        tail = minutes(Greatest(last_hour, first_hour), window_end)
        query = rolled.union(head, tail, all=True)
    totals: dict[int, tuple[int, int]] = {}
    for item in query:
        reservation_id = item[f"{booked}reservation_id"]
        measured, idle = totals.get(reservation_id, (0, 0))
        totals[reservation_id] = (measured + (item["measured"] or 0), idle + (item["idle"] or 0))
    return totals


# --- quota ---------------------------------------------------------------------------------------
@dataclasses.dataclass
class QuotaRow:
    """A team's month as the report shows it: reservations.selectors.QuotaPosition (the one
    quota rule) and where the month is heading."""

    team: str
    position: reservation_selectors.QuotaPosition
    forecast_gpu_hours: float | None  # expected month-end use; None for a month not begun

    team_id = property(lambda self: self.position.team_id)
    time_zone = property(lambda self: self.position.time_zone)
    month = property(lambda self: self.position.month)
    month_start = property(lambda self: self.position.month_start)
    month_end = property(lambda self: self.position.month_end)
    quota_gpu_hours = property(lambda self: self.position.quota_gpu_hours)
    reserved_gpu_hours = property(lambda self: self.position.booked_gpu_hours)  # slots still ahead included
    reserved_to_date_gpu_hours = property(lambda self: self.position.booked_to_date_gpu_hours)
    backfill_gpu_hours = property(lambda self: self.position.backfill_gpu_hours)
    used_gpu_hours = property(lambda self: self.position.used_gpu_hours)
    remaining_gpu_hours = property(lambda self: self.position.remaining_gpu_hours)

    @property
    def forecast_over_quota(self) -> bool:
        return self.forecast_gpu_hours is not None and self.forecast_gpu_hours > self.quota_gpu_hours


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
    containing now). Three queries when the teams share a time zone: teams, bookings,
    backfill runs (reservations.selectors.quota_positions)."""
    teams = list(reservation_selectors.teams_visible_to(user=user).order_by("name"))
    positions = reservation_selectors.quota_positions(teams=teams, now=now, year=year, month=month)
    rows = []
    for team in teams:
        position = positions[team.pk]
        consumed = position.booked_to_date_gpu_hours + position.backfill_gpu_hours
        booked_ahead = position.booked_gpu_hours - position.booked_to_date_gpu_hours
        rows.append(
            QuotaRow(
                team=team.name,
                position=position,
                forecast_gpu_hours=forecast_gpu_hours(
                    month_start=position.month_start, month_end=position.month_end, now=now,
                    consumed_to_date=consumed, booked_ahead=booked_ahead,
                ),
            )
        )
    return rows
