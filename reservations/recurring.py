"""Recurring bookings: "every Tuesday 18:00–22:00 until 31 March" as an RFC 5545 RRULE.

The rule is read in a time zone (the team's unless given), so 18:00 stays 18:00 across a DST
change. Each occurrence is booked by `services.reservation_create`, exactly as a single booking
would be — overlap, quota (each occurrence in its own month), notice, horizon, approval — in
its own transaction, so one refused date never undoes the others. The caller gets one report:
what was booked and which dates could not be, with the service's own reason for each.
"""

import datetime as dt
import zoneinfo
from dataclasses import dataclass, field

import icalendar
from dateutil.rrule import rrulestr
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from config.errors import DomainError, ErrorCode, NotFound, NotPermitted
from gpus.models import Gpu
from reservations import selectors, services
from reservations.api import path_id
from reservations.ical import PRODID
from reservations.models import Reservation, ReservationSeries, SeriesOccurrence, Team
from reservations.serializers import MAX_ID, AwareDateTimeField, ReservationSerializer

MAX_OCCURRENCES = 100


@dataclass
class SeriesReport:
    series: ReservationSeries | None
    booked: list[Reservation] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)  # {"start", "code", "detail"}


def occurrences(*, rule: str, first_start: dt.datetime, zone: zoneinfo.ZoneInfo) -> list[dt.datetime]:
    """The rule's start times in UTC. The rule must end (UNTIL or COUNT): an endless series
    would book the future away. Wall-clock times that do not exist (a spring-forward gap)
    take the offset before the gap, as zoneinfo does (fold=0)."""
    text = rule.strip().removeprefix("RRULE:")
    if not text or "\n" in text:
        raise DomainError(ErrorCode.INVALID_RULE, "Give one RRULE, e.g. FREQ=WEEKLY;BYDAY=TU;UNTIL=20270331T235959Z.")
    upper = text.upper()
    if "UNTIL=" not in upper and "COUNT=" not in upper:
        raise DomainError(ErrorCode.ENDLESS_RULE, "The rule needs an end: add UNTIL=… or COUNT=….")
    local_start = first_start.astimezone(zone).replace(tzinfo=None)
    starts = []
    try:
        # With a naive (wall-clock) start, dateutil wants UNTIL in wall time too.
        for index, local in enumerate(rrulestr(_until_to_local(text, zone), dtstart=local_start)):
            if index >= MAX_OCCURRENCES:
                raise DomainError(
                    ErrorCode.TOO_MANY_OCCURRENCES, f"A series has at most {MAX_OCCURRENCES} occurrences."
                )
            starts.append(local.replace(tzinfo=zone).astimezone(dt.UTC))
    except (ValueError, TypeError) as error:
        raise DomainError(ErrorCode.INVALID_RULE, f"Not a valid RRULE: {error}.") from None
    if not starts:
        raise DomainError(ErrorCode.EMPTY_RULE, "The rule gives no date at or after the first start.")
    return starts


def _until_to_local(text: str, zone: zoneinfo.ZoneInfo) -> str:
    """dateutil refuses a UTC UNTIL with a naive start; rewrite UNTIL into the zone's wall time."""
    parts = []
    for part in text.split(";"):
        key, _, value = part.partition("=")
        if key.upper() == "UNTIL" and value.upper().endswith("Z"):
            instant = dt.datetime.strptime(value.upper(), "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
            value = instant.astimezone(zone).strftime("%Y%m%dT%H%M%S")
        parts.append(f"{key}={value}")
    return ";".join(parts)


def series_create(
    *, user: AbstractBaseUser, team: Team, gpu_ids: list[int], start: dt.datetime, end: dt.datetime, rule: str,
    now: dt.datetime, note: str = "", time_zone: str | None = None,
) -> SeriesReport:
    """Book every occurrence of `rule` (the first at [start, end)); report the ones refused."""
    if end <= start:
        raise DomainError(ErrorCode.INVALID_RANGE, "The end must be after the start.")
    try:
        zone = zoneinfo.ZoneInfo(time_zone) if time_zone else team.tzinfo
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise DomainError(ErrorCode.UNKNOWN_TIME_ZONE, f"Unknown time zone {time_zone!r}.") from None
    starts = occurrences(rule=rule, first_start=start, zone=zone)
    # A set, not .distinct(): Gpu's default ordering would join the DISTINCT, one row per GPU.
    gpus = sorted(set(Gpu.objects.filter(pk__in=gpu_ids).values_list("node_id", flat=True)))
    if len(gpus) != 1:
        raise DomainError(ErrorCode.INVALID_GPUS, "Choose GPUs of one node.")
    # Each occurrence keeps the first one's wall-clock length, so 18:00–22:00 stays 4 hours.
    local_start, local_end = start.astimezone(zone), end.astimezone(zone)
    wall_length = local_end.replace(tzinfo=None) - local_start.replace(tzinfo=None)
    report = SeriesReport(series=None)
    attempts: list[tuple[dt.datetime, Reservation | None, DomainError | None]] = []
    for occurrence in starts:
        local = occurrence.astimezone(zone).replace(tzinfo=None)
        occurrence_end = (local + wall_length).replace(tzinfo=zone).astimezone(dt.UTC)
        try:
            booked = services.reservation_create(
                user=user, team=team, gpu_ids=gpu_ids, start=occurrence, end=occurrence_end, note=note, now=now
            )
        except DomainError as refused:
            attempts.append((occurrence, None, refused))
        else:
            attempts.append((occurrence, booked, None))
    with transaction.atomic():
        series = ReservationSeries.objects.create(
            user=user, team=team, node_id=gpus[0], gpu_ids=sorted(gpu_ids), rule=rule.strip().removeprefix("RRULE:"),
            time_zone=str(zone), first_start=start, duration_s=int((end - start).total_seconds()), note=note,
            created_at=now,
        )
        SeriesOccurrence.objects.bulk_create(
            SeriesOccurrence(
                series=series, start=occurrence, reservation=booked,
                problem_code=refused.code if refused else "", problem=refused.detail[:500] if refused else "",
            )
            for occurrence, booked, refused in attempts
        )
    report.series = series
    for occurrence, booked, refused in attempts:
        if booked is not None:
            report.booked.append(booked)
        else:
            report.failed.append({"start": occurrence.isoformat(), "code": refused.code, "detail": refused.detail})
    return report


def _series_for(*, series_id: int, actor: AbstractBaseUser) -> ReservationSeries:
    series = ReservationSeries.objects.select_related("team", "node").filter(pk=series_id).first()
    if series is None or not (
        actor.is_superuser or series.user_id == actor.pk or selectors.teams_visible_to(user=actor).filter(
            pk=series.team_id).exists()
    ):
        raise NotFound(ErrorCode.NOT_FOUND, f"No series #{series_id}.")
    return series


def series_get(*, series_id: int, actor: AbstractBaseUser) -> ReservationSeries:
    return _series_for(series_id=series_id, actor=actor)


def series_cancel(
    *, series_id: int, actor: AbstractBaseUser, now: dt.datetime, from_start: dt.datetime | None = None,
    reason: str = "series cancelled",
) -> list[Reservation]:
    """Cancel the occurrences that have not begun (from `from_start` on, when given: "this and
    the rest"). One occurrence alone is cancelled like any booking. Each goes through
    `services.reservation_cancel`, so refunds, audit and notices are those of a single booking."""
    series = _series_for(series_id=series_id, actor=actor)
    if not (actor.is_superuser or series.user_id == actor.pk
            or selectors.user_can_manage_team(user=actor, team_id=series.team_id)):
        raise NotPermitted(
            ErrorCode.NOT_PERMITTED, "Only the booker, a team manager or an admin may cancel this series."
        )
    upcoming = Reservation.objects.filter(
        series_occurrence__series=series, status__in=(Reservation.Status.PENDING, Reservation.Status.CONFIRMED),
        start__gt=now,
    )
    if from_start is not None:
        upcoming = upcoming.filter(start__gte=from_start)
    cancelled = []
    for reservation_id in upcoming.order_by("start").values_list("pk", flat=True):
        cancelled.append(
            services.reservation_cancel(reservation_id=reservation_id, actor=actor, now=now, reason=reason)
        )
    return cancelled


def series_ical(*, series: ReservationSeries) -> bytes:
    """The series as one recurring event (RRULE in the series' zone), with an EXDATE for every
    date that is not booked (refused, or cancelled since), so a calendar shows what is held."""
    zone = zoneinfo.ZoneInfo(series.time_zone)
    rows = list(series.occurrences.select_related("reservation"))
    held = Reservation.OCCUPYING
    calendar = icalendar.Calendar()
    calendar.add("prodid", PRODID)
    calendar.add("version", "2.0")
    event = icalendar.Event()
    event.add("uid", f"series-{series.pk}@gpubook")
    event.add("summary", f"GPUs on {series.node.name} ({series.team.name})")
    first = series.first_start.astimezone(zone)
    event.add("dtstart", first)
    event.add("dtend", first + dt.timedelta(seconds=series.duration_s))
    event.add("rrule", icalendar.vRecur.from_ical(series.rule))
    excluded = [row.start.astimezone(zone) for row in rows if row.reservation is None or row.reservation.status
                not in held]
    if excluded:
        event.add("exdate", excluded)
    if series.note:
        event.add("description", series.note)
    event.add("dtstamp", series.created_at)
    calendar.add_component(event)
    calendar.add_missing_timezones()
    return calendar.to_ical()


# --- API ----------------------------------------------------------------------------------------


class SeriesCreateSerializer(serializers.Serializer):
    gpus = serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=MAX_ID), min_length=1,
                                 max_length=64)
    team = serializers.IntegerField(min_value=1, max_value=MAX_ID)
    start = AwareDateTimeField()  # its rules in words: config/openapi.py _timing_rules
    end = AwareDateTimeField()
    rrule = serializers.CharField(max_length=500, help_text=f"RFC 5545 RRULE with UNTIL or COUNT and at most "
                                                           f"{MAX_OCCURRENCES} occurrences, e.g. "
                                                           "FREQ=WEEKLY;BYDAY=TU;UNTIL=20270331T235959Z")
    time_zone = serializers.CharField(max_length=64, required=False,
                                      help_text="An IANA time zone name, e.g. Europe/Berlin. Default: the team's zone.")
    note = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")


class SeriesCancelSerializer(serializers.Serializer):
    from_start = AwareDateTimeField(required=False, help_text="Cancel this occurrence and the rest; default: all.")
    reason = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class FailedOccurrenceSerializer(serializers.Serializer):
    start = serializers.DateTimeField()
    code = serializers.CharField()
    detail = serializers.CharField()


class SeriesSerializer(serializers.ModelSerializer):
    team = serializers.IntegerField(source="team_id")
    node = serializers.CharField(source="node.name")
    booked = serializers.SerializerMethodField()
    failed = serializers.SerializerMethodField()

    class Meta:
        model = ReservationSeries
        fields = ["id", "team", "node", "gpu_ids", "rule", "time_zone", "first_start", "duration_s", "note",
                  "created_at", "booked", "failed"]

    def get_booked(self, series: ReservationSeries) -> list[int]:
        return [row.reservation_id for row in series.occurrences.all() if row.reservation_id]

    @extend_schema(responses=FailedOccurrenceSerializer(many=True))
    def get_failed(self, series: ReservationSeries) -> list[dict]:
        return [{"start": row.start.isoformat(), "code": row.problem_code, "detail": row.problem}
                for row in series.occurrences.all() if row.reservation_id is None and row.problem_code]


class SeriesViewSet(viewsets.ViewSet):
    """Recurring bookings. Each occurrence is also an ordinary reservation in /reservations/."""

    @extend_schema(request=SeriesCreateSerializer, responses={201: SeriesSerializer})
    def create(self, request):
        data = SeriesCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        team = Team.objects.filter(pk=values["team"]).first()
        if team is None:
            raise DomainError(ErrorCode.UNKNOWN_TEAM, f"No team with id {values['team']}.")
        report = series_create(
            user=request.user, team=team, gpu_ids=values["gpus"], start=values["start"], end=values["end"],
            rule=values["rrule"], note=values["note"], time_zone=values.get("time_zone"), now=timezone.now(),
        )
        return Response(SeriesSerializer(report.series).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: SeriesSerializer})
    def retrieve(self, request, pk=None):
        return Response(SeriesSerializer(series_get(series_id=path_id(pk), actor=request.user)).data)

    @extend_schema(request=SeriesCancelSerializer, responses={200: ReservationSerializer(many=True)})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        data = SeriesCancelSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        cancelled = series_cancel(
            series_id=path_id(pk), actor=request.user, now=timezone.now(),
            from_start=data.validated_data.get("from_start"),
            reason=data.validated_data["reason"] or "series cancelled",
        )
        rows = Reservation.objects.filter(pk__in=[r.pk for r in cancelled]).select_related("team", "user", "node")
        return Response(ReservationSerializer(rows.prefetch_related("booked"), many=True).data)

    @extend_schema(responses={(200, "text/calendar"): str})
    @action(detail=True, url_path="ical")
    def ical(self, request, pk=None):
        series = series_get(series_id=path_id(pk), actor=request.user)
        response = HttpResponse(series_ical(series=series), content_type="text/calendar; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="gpubook-series-{series.pk}.ics"'
        return response
