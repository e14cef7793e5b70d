"""Reads. Every function takes what it needs as keyword arguments; none writes."""

import datetime as dt
from collections.abc import Iterable

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


def month_position(*, team: Team, month_start: dt.datetime, used_seconds: float) -> dict:
    """A quota position in GPU-hours for the month (team time zone) starting at `month_start`."""
    used_hours = used_seconds / 3600
    return {
        "month": month_start.astimezone(team.tzinfo).strftime("%Y-%m"),
        "quota_gpu_hours": team.monthly_gpu_hours,
        "used_gpu_hours": round(used_hours, 2),
        "remaining_gpu_hours": round(max(0.0, team.monthly_gpu_hours - used_hours), 2),
    }


def team_month_usage(*, team: Team, now: dt.datetime) -> dict:
    """This month's quota position in the team's time zone, in GPU-hours."""
    start = timegrid.month_start(now, team.tzinfo)
    end = timegrid.next_month_start(now, team.tzinfo)
    return month_position(
        team=team, month_start=start, used_seconds=usage_seconds(team=team, window_start=start, window_end=end)
    )


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
