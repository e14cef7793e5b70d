"""Reads. Every function takes what it needs as keyword arguments; none writes."""

import dataclasses
import datetime as dt
from collections import defaultdict
from collections.abc import Callable, Iterable

from django.apps import apps
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import DurationField, ExpressionWrapper, F, Q, QuerySet, Subquery, Sum, Value
from django.db.models.functions import Greatest, Least

from config.batch import columns, fetch_prepared, fetch_together, instance_from_row
from config.errors import ErrorCode, NotFound, NotPermitted
from gpus.models import Gpu, MaintenanceWindow, Node
from reservations import timegrid
from reservations.models import Membership, Reservation, ReservationGpu, Team


# --- who may do what: the one permission layer (services, pages, APIs and admin read it) -------
def user_team_roles(*, user: AbstractBaseUser) -> dict[int, str]:
    """{team id: role} for the user's memberships."""
    return dict(Membership.objects.filter(user=user).values_list("team_id", "role"))


def team_role(*, user: AbstractBaseUser, team_id: int) -> str | None:
    """The user's Membership.Role in the team, or None when not a member (admins included:
    being an admin is `user.is_superuser`, not a team role)."""
    return Membership.objects.filter(user=user, team_id=team_id).values_list("role", flat=True).first()


def user_can_manage_team(*, user: AbstractBaseUser, team_id: int) -> bool:
    """Admins and the team's managers manage a team (approve, webhooks, others' bookings)."""
    return user.is_superuser or team_role(user=user, team_id=team_id) == Membership.Role.MANAGER


def managed_team_ids(*, user: AbstractBaseUser) -> list[int]:
    """The teams the user manages (not every team for an admin: callers decide that)."""
    return list(
        Membership.objects.filter(user=user, role=Membership.Role.MANAGER).values_list("team_id", flat=True)
    )


def team_manager_ids(*, team_id: int) -> list[int]:
    """The user ids of the team's managers (who hear about its quota and webhooks)."""
    return list(
        Membership.objects.filter(team_id=team_id, role=Membership.Role.MANAGER).values_list("user_id", flat=True)
    )


def can_change(*, user: AbstractBaseUser, obj) -> bool:
    """May `user` change `obj` (anything with `user_id` and `team_id`: a booking, a job)?
    Its owner, a manager of its team, or an admin."""
    return user.is_superuser or obj.user_id == user.pk or user_can_manage_team(user=user, team_id=obj.team_id)


def require_can_change(*, user: AbstractBaseUser, obj, not_found: str, not_permitted: str) -> None:
    """`can_change`, or the error to answer (with the caller's sentences): NotFound to someone
    outside the team (another team's booking or job is not revealed), NotPermitted to a
    teammate who is not a manager."""
    if user.is_superuser or obj.user_id == user.pk:
        return
    role = team_role(user=user, team_id=obj.team_id)
    if role is None:
        raise NotFound(ErrorCode.NOT_FOUND, not_found)
    if role != Membership.Role.MANAGER:
        raise NotPermitted(ErrorCode.NOT_PERMITTED, not_permitted)


def booking_gpus(*, gpu_ids: Iterable[int], user: AbstractBaseUser, team_id: int) -> tuple[list[Gpu], str | None]:
    """The GPUs of `gpu_ids` that exist (with their node), and the user's role in the team
    (`team_role`): one query, since a booking asks both before it locks anything; its
    statement built once per number of GPUs (`fetch_prepared`: on every booking)."""
    ids = sorted(set(gpu_ids))
    if not ids:
        return [], team_role(user=user, team_id=team_id)

    def build(values: dict) -> list[QuerySet]:
        role = Membership.objects.filter(user_id=values["user"], team_id=values["team"]).values("role")[:1]
        return [
            Gpu.objects.filter(pk__in=values["gpus"]).annotate(booker_role=Subquery(role))
            .values(*columns(Gpu), *columns(Node, "node__"), "booker_role")
        ]

    (rows,) = fetch_prepared(key=("booking_gpus", len(ids)), build=build,
                             values={"gpus": ids, "user": user.pk, "team": team_id})
    if not rows:
        return [], team_role(user=user, team_id=team_id)
    gpus = []
    for row in rows:
        gpu = instance_from_row(Gpu, row)
        gpu.node = instance_from_row(Node, row, "node__")
        gpus.append(gpu)
    return gpus, rows[0]["booker_role"]


def team_by_id(*, team_id: int) -> Team | None:
    """The team, or None: asked on every booking, so its statement is built once."""
    (rows,) = fetch_prepared(
        key="team_by_id", build=lambda values: [Team.objects.filter(pk=values["team"]).values(*columns(Team))],
        values={"team": team_id},
    )
    return instance_from_row(Team, rows[0]) if rows else None


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


def usage_rows(
    *,
    team_id: int,
    window_start: dt.datetime,
    window_end: dt.datetime,
    user_id: int | None = None,
    exclude_reservation_id: int | None = None,
) -> QuerySet:
    """The rows `usage_seconds` sums, as a `.values()` query (so the booking check can send it
    with its other reads in one round trip: config.batch.fetch_prepared)."""
    rows = Reservation.objects.filter(
        team_id=team_id, status__in=Reservation.OCCUPYING, start__lt=window_end, end__gt=window_start
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
    return rows.order_by().values("gpu_count").annotate(total=Sum(overlap))


def usage_total(rows: Iterable[dict]) -> int:
    """GPU-seconds from `usage_rows`' rows."""
    return sum(row["gpu_count"] * round(row["total"].total_seconds()) for row in rows)


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
    return usage_total(
        usage_rows(
            team_id=team.pk, window_start=window_start, window_end=window_end, user_id=user_id,
            exclude_reservation_id=exclude_reservation_id,
        )
    )


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


def _booked_rows(
    *, team_ids: list[int], window_start: dt.datetime, window_end: dt.datetime, now: dt.datetime,
    exclude_reservation_id: int | None,
) -> QuerySet:
    """Booked GPU-seconds in the window by team and GPU count, and the part before `now`:
    summed in the database (SQLite cannot multiply a duration), because a team's month can
    hold thousands of bookings and the booking check runs inside the booking lock."""
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
    return rows.order_by().values("team_id", "gpu_count").annotate(**sums)


def _backfill_rows(*, windows: dict[int, tuple[dt.datetime, dt.datetime]], now: dt.datetime) -> QuerySet:
    """The teams' backfill runs that overlap their windows. Runs are `training`'s table, read
    through the app registry as /metrics does: this room sits below training and imports none
    of it."""
    run_model = apps.get_model("training", "Run")
    earliest = min(start for start, _ in windows.values())
    latest = max(end for _, end in windows.values())
    return (
        run_model.objects.filter(
            job__team_id__in=list(windows), kind="backfill", started_at__isnull=False,
            started_at__lt=min(latest, now),
        )
        .exclude(ended_at__lte=earliest)
        .values("job__team_id", "started_at", "ended_at", "gpu_ids")
    )


@dataclasses.dataclass(frozen=True)
class QuotaQuery:
    """The reads behind some teams' quota positions in the given month `windows`, not yet
    sent: `querysets()` go to the database (alone, or with a caller's other reads in one
    round trip) and `positions` turns their rows into QuotaPositions. `quota_positions` is
    the way to use it; the booking check sends these with its overlap and maintenance reads
    while it holds the booking lock."""

    teams: tuple[Team, ...]
    windows: dict[int, tuple[dt.datetime, dt.datetime]]
    now: dt.datetime
    exclude_reservation_id: int | None = None

    def querysets(self) -> list[QuerySet]:
        """One read per distinct window among the teams (one, unless their zones differ),
        then the backfill runs; `positions` takes their rows in this order."""
        windows = self.windows
        querysets = [
            _booked_rows(
                team_ids=[team_id for team_id, team_window in windows.items() if team_window == window],
                window_start=window[0], window_end=window[1], now=self.now,
                exclude_reservation_id=self.exclude_reservation_id,
            )
            for window in sorted(set(windows.values()))
        ]
        querysets.append(_backfill_rows(windows=windows, now=self.now))
        return querysets

    def positions(self, results: list[list[dict]]) -> dict[int, QuotaPosition]:
        *booked_results, backfill_rows = results
        booked: dict[int, float] = defaultdict(float)
        to_date: dict[int, float] = defaultdict(float)
        for rows in booked_results:
            for group in rows:
                booked[group["team_id"]] += group["gpu_count"] * round(group["total"].total_seconds())
                if group.get("to_date") is not None:
                    to_date[group["team_id"]] += group["gpu_count"] * round(group["to_date"].total_seconds())
        factor = settings.GPUBOOK_BACKFILL_USAGE_FACTOR
        backfill: dict[int, float] = defaultdict(float)
        for row in backfill_rows:  # a running run counts up to `now`
            window_start, window_end = self.windows[row["job__team_id"]]
            end = min(row["ended_at"] or self.now, self.now, window_end)
            backfill[row["job__team_id"]] += (
                len(row["gpu_ids"]) * factor * max(0.0, (end - max(row["started_at"], window_start)).total_seconds())
            )
        positions = {}
        for team in self.teams:
            window_start, window_end = self.windows[team.pk]
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


def quota_query(
    *,
    teams: Iterable[Team],
    now: dt.datetime,
    year: int | None = None,
    month: int | None = None,
    at: dt.datetime | None = None,
    exclude_reservation_id: int | None = None,
) -> QuotaQuery | None:
    """The reads for `quota_positions` (same arguments); None for no teams."""
    teams = tuple(teams)
    if not teams:
        return None
    windows = {team.pk: month_window(team=team, at=at or now, year=year, month=month) for team in teams}
    return QuotaQuery(teams=teams, windows=windows, now=now, exclude_reservation_id=exclude_reservation_id)


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
    for `year`-`month` (each team's own zone). One round trip on PostgreSQL (one query per
    distinct month window among the teams for bookings — one, unless their zones differ —
    and one for backfill runs, sent together). `exclude_reservation_id` leaves one booking
    out (a reschedule checks without itself)."""
    query = quota_query(teams=teams, now=now, year=year, month=month, at=at,
                        exclude_reservation_id=exclude_reservation_id)
    if query is None:
        return {}
    return query.positions(fetch_together(*query.querysets()))


def team_quota_position(
    *, team: Team, now: dt.datetime, at: dt.datetime | None = None, exclude_reservation_id: int | None = None
) -> QuotaPosition:
    """The team's quota position in its month containing `at` (default: this month)."""
    return quota_positions(teams=[team], now=now, at=at, exclude_reservation_id=exclude_reservation_id)[team.pk]


def _conflicts(
    *, gpu_ids: Iterable[int], start: dt.datetime, end: dt.datetime, exclude_reservation_id: int | None
) -> QuerySet[ReservationGpu]:
    rows = ReservationGpu.objects.filter(gpu_id__in=list(gpu_ids), occupies=True, start__lt=end, end__gt=start)
    if exclude_reservation_id is not None:
        rows = rows.exclude(reservation_id=exclude_reservation_id)
    return rows


def conflicting_bookings(
    *,
    gpu_ids: Iterable[int],
    start: dt.datetime,
    end: dt.datetime,
    exclude_reservation_id: int | None = None,
) -> list[ReservationGpu]:
    return list(
        _conflicts(gpu_ids=gpu_ids, start=start, end=end, exclude_reservation_id=exclude_reservation_id)
        .select_related("reservation__team", "reservation__user")
        .order_by("start", "gpu_id")
    )


def _maintenance(
    *, node_id: int, gpu_ids: Iterable[int], start: dt.datetime, end: dt.datetime
) -> QuerySet[MaintenanceWindow]:
    return (
        MaintenanceWindow.objects.filter(node_id=node_id, start__lt=end, end__gt=start)
        .filter(Q(gpus__isnull=True) | Q(gpus__in=list(gpu_ids)))
        .distinct()
    )


def maintenance_overlapping(
    *, node_id: int, gpu_ids: Iterable[int], start: dt.datetime, end: dt.datetime
) -> list[MaintenanceWindow]:
    return list(_maintenance(node_id=node_id, gpu_ids=gpu_ids, start=start, end=end).order_by("start", "id"))


@dataclasses.dataclass(frozen=True)
class BookingReads:
    """What the booking check reads while it holds the booking lock (issue #19: one round
    trip on PostgreSQL instead of one per question)."""

    in_maintenance: bool
    in_the_way: bool  # another occupying booking overlaps on one of the GPUs
    months: list[QuotaPosition]  # each calendar month the booking touches, in order
    days: list[tuple[dt.datetime, dt.datetime, int]]  # (day start, day end, the booker's GPU-seconds); [] without a cap
    also: list[list[dict]]  # the rows of the caller's `also` querysets


def booking_reads(
    *,
    team: Team,
    user_id: int,
    node_id: int,
    gpu_ids: Iterable[int],
    start: dt.datetime,
    end: dt.datetime,
    now: dt.datetime,
    exclude_reservation_id: int | None,
    also: Callable[..., Iterable[QuerySet]] | None = None,
) -> BookingReads:
    """Read, in one round trip: whether maintenance or another booking is in the way, the
    quota position (`QuotaQuery`, the one quota rule) of every month [start, end) touches,
    the booker's use of each day it touches when the team caps it, and what the caller's
    `also(user_id=, team_id=)` asks (`.values()` querysets). `team` is the row read under the
    booking lock. Sent with `fetch_prepared`: on every booking, so its statement is built
    once per shape (how many GPUs, months and capped days; a reschedule or not)."""
    tz = team.tzinfo
    months = [month_window(team=team, at=month_start) for month_start, _ in timegrid.split_by_period(start, end, tz)]
    days = []
    if team.user_daily_cap_gpu_hours is not None:
        days = list(timegrid.split_by_period(
            start, end, tz, period_start=timegrid.day_start, next_period_start=timegrid.next_day_start
        ))
    gpu_ids = sorted(set(gpu_ids))
    values = {
        "team": team.pk, "user": user_id, "node": node_id, "gpus": gpu_ids, "start": start, "end": end, "now": now,
        "exclude": exclude_reservation_id,
        **{f"month{number}_{edge}": moment for number, window in enumerate(months)
           for edge, moment in zip(("start", "end"), window, strict=True)},
        **{f"day{number}_{edge}": moment for number, window in enumerate(days)
           for edge, moment in zip(("start", "end"), window, strict=True)},
    }

    def month_query(values: dict, number: int) -> QuotaQuery:
        window = values[f"month{number}_start"], values[f"month{number}_end"]
        return QuotaQuery(teams=(team,), windows={values["team"]: window}, now=values["now"],
                          exclude_reservation_id=values["exclude"])

    def build(values: dict) -> list[QuerySet]:  # every value from `values`: see fetch_prepared
        gpus, first, last = values["gpus"], values["start"], values["end"]
        return [
            _maintenance(node_id=values["node"], gpu_ids=gpus, start=first, end=last).values("id")[:1],
            _conflicts(gpu_ids=gpus, start=first, end=last, exclude_reservation_id=values["exclude"]).values("id")[:1],
            *(queryset for number in range(len(months)) for queryset in month_query(values, number).querysets()),
            *(
                usage_rows(team_id=values["team"], window_start=values[f"day{number}_start"],
                           window_end=values[f"day{number}_end"], user_id=values["user"],
                           exclude_reservation_id=values["exclude"])
                for number in range(len(days))
            ),
            *(also(user_id=values["user"], team_id=values["team"]) if also else ()),
        ]

    key = ("booking_reads", len(gpu_ids), len(months), len(days), exclude_reservation_id is None, also)
    maintenance_rows, conflict_rows, *rest = fetch_prepared(key=key, build=build, values=values)
    positions = []
    for number in range(len(months)):
        # One team, so two reads a month (QuotaQuery.querysets): its bookings, its backfill runs.
        positions.append(month_query(values, number).positions(rest[:2])[team.pk])
        rest = rest[2:]
    day_rows, also_rows = rest[: len(days)], rest[len(days):]
    return BookingReads(
        in_maintenance=bool(maintenance_rows),
        in_the_way=bool(conflict_rows),
        months=positions,
        days=[(start_, end_, usage_total(rows)) for (start_, end_), rows in zip(days, day_rows, strict=True)],
        also=also_rows,
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


def calendar_free_gpus(*, start: dt.datetime, end: dt.datetime) -> list[tuple[int, list[int]]]:
    """Each node with its active GPUs that no occupying booking and no maintenance window
    touches in [start, end), in node order (name, then id) and index order: what a booking
    of that slot could take (`reservations.placement` chooses among them)."""
    taken = set(
        ReservationGpu.objects.filter(occupies=True, start__lt=end, end__gt=start).values_list("gpu_id", flat=True)
    )
    closed_nodes: set[int] = set()
    for node_id, gpu_id in MaintenanceWindow.objects.filter(start__lt=end, end__gt=start).values_list(
        "node_id", "gpus"
    ):
        if gpu_id is None:
            closed_nodes.add(node_id)  # a window listing no GPUs covers the whole node
        else:
            taken.add(gpu_id)
    free: dict[int, list[int]] = {}
    for gpu_id, node_id in Gpu.objects.filter(state=Gpu.State.ACTIVE).order_by(
        "node__name", "node_id", "index"
    ).values_list("pk", "node_id"):
        free.setdefault(node_id, [])
        if gpu_id not in taken and node_id not in closed_nodes:
            free[node_id].append(gpu_id)
    return list(free.items())
