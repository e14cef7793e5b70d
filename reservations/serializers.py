"""Input parsing and output shapes for the API. No rules here: services decide."""

import datetime as dt

from django.utils.dateparse import parse_datetime
from rest_framework import serializers

from config.errors import DomainError, ErrorCode
from gpus.models import Gpu
from reservations import timegrid
from reservations.models import Reservation, Team

# Ids beyond a 64-bit integer cannot exist; refusing them here keeps them away from SQLite,
# which raises OverflowError instead of finding nothing.
MAX_ID = 2**63 - 1


class AwareDateTimeField(serializers.Field):
    """ISO-8601 with an offset. A naive time is refused rather than guessed: a booking made
    in the wrong zone would silently take someone else's slot."""

    def to_internal_value(self, data: object) -> dt.datetime:
        if not isinstance(data, str):
            raise DomainError(ErrorCode.INVALID_DATETIME, f"{self.field_name}: expected an ISO-8601 string.")
        try:
            value = parse_datetime(data.strip())
        except ValueError:
            value = None
        if value is None:
            raise DomainError(ErrorCode.INVALID_DATETIME, f"{self.field_name}: {data!r} is not an ISO-8601 date-time.")
        if not timegrid.is_aware(value):
            raise DomainError(
                ErrorCode.NAIVE_DATETIME,
                f"{self.field_name}: {data!r} has no UTC offset; add one, e.g. 2026-12-01T09:00:00+01:00.",
            )
        try:
            return value.astimezone(dt.UTC)
        except OverflowError:  # e.g. 9999-12-31T23:59-14:00 is past the last representable instant
            raise DomainError(ErrorCode.INVALID_DATETIME, f"{self.field_name}: {data!r} is out of range.") from None

    def to_representation(self, value: dt.datetime) -> str:
        return utc_iso(value)


def utc_iso(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).isoformat()


# How a ModelSerializer renders a DateTimeField (the settings' format and zone); it keeps no
# state between calls.
_MODEL_TIME = serializers.DateTimeField()


class GpuSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name")
    node_id = serializers.IntegerField()

    class Meta:
        model = Gpu
        fields = ["id", "node", "node_id", "index", "uuid", "model_name", "memory_mib", "state"]


# The most GPUs one booking may name (the schema states it); booking_input checks the same bound.
MAX_GPUS_PER_BOOKING = 64


class ReservationCreateSerializer(serializers.Serializer):
    gpus = serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=MAX_ID),
                                 max_length=MAX_GPUS_PER_BOOKING)
    start = AwareDateTimeField()
    end = AwareDateTimeField()
    team = serializers.IntegerField(min_value=1, max_value=MAX_ID)
    note = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")


def _bound_time(name: str) -> AwareDateTimeField:
    field = AwareDateTimeField()
    field.bind(name, None)  # its messages name the field; it keeps no state between calls
    return field


_BOUND_TIMES = {name: _bound_time(name) for name in ("start", "end")}


def booking_input(data: object) -> dict | None:
    """ReservationCreateSerializer's validated data for the plain input nearly every booking
    sends (issue #19: the serializer was a tenth of a booking's CPU): a JSON object with
    `gpus` (a list of ids), `team` (an id), `start` and `end`, and no `note`. None for
    anything else, which the serializer then parses, so every refusal keeps its answer.
    tests/reservations/test_api.py holds the two to the same values."""
    if not isinstance(data, dict) or "note" in data:
        return None
    gpus, team = data.get("gpus"), data.get("team")
    if type(gpus) is not list or len(gpus) > MAX_GPUS_PER_BOOKING or type(team) is not int or not 1 <= team <= MAX_ID:
        return None
    if any(type(gpu) is not int or not 1 <= gpu <= MAX_ID for gpu in gpus):
        return None
    try:
        times = {name: field.to_internal_value(data.get(name)) for name, field in _BOUND_TIMES.items()}
    except DomainError:
        return None
    return {"gpus": gpus, **times, "team": team, "note": ""}


class ReservationUpdateSerializer(serializers.Serializer):
    start = AwareDateTimeField(required=False)
    end = AwareDateTimeField(required=False)


class ReasonSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class ReservationSerializer(serializers.ModelSerializer):
    start = AwareDateTimeField()
    end = AwareDateTimeField()
    gpus = serializers.SerializerMethodField()
    team = serializers.IntegerField(source="team_id")
    team_name = serializers.CharField(source="team.name")
    user = serializers.CharField(source="user.username")
    node = serializers.CharField(source="node.name")
    gpu_hours = serializers.SerializerMethodField()

    class Meta:
        model = Reservation
        fields = [
            "id", "gpus", "node", "team", "team_name", "user", "start", "end", "status", "note",
            "release_reason", "gpu_hours", "created_at", "updated_at",
        ]

    def to_representation(self, reservation: Reservation) -> dict:
        """Built straight from the object (issue #19: DRF's field machinery was a tenth of a
        booking's CPU). The fields declared above still give the schema;
        tests/reservations/test_api.py holds this to what they would render."""
        return {
            "id": reservation.pk,
            "gpus": self.get_gpus(reservation),
            "node": reservation.node.name,
            "team": reservation.team_id,
            "team_name": reservation.team.name,
            "user": reservation.user.username,
            "start": utc_iso(reservation.start),
            "end": utc_iso(reservation.end),
            "status": reservation.status,
            "note": reservation.note,
            "release_reason": reservation.release_reason,
            "gpu_hours": self.get_gpu_hours(reservation),
            "created_at": _MODEL_TIME.to_representation(reservation.created_at),
            "updated_at": _MODEL_TIME.to_representation(reservation.updated_at),
        }

    def get_gpus(self, reservation: Reservation) -> list[int]:
        return sorted(row.gpu_id for row in reservation.booked.all())

    def get_gpu_hours(self, reservation: Reservation) -> float:
        return round(reservation.gpu_seconds / 3600, 2)


class TeamSerializer(serializers.ModelSerializer):
    role = serializers.SerializerMethodField()
    usage = serializers.SerializerMethodField()

    class Meta:
        model = Team
        fields = [
            "id", "name", "slug", "time_zone", "role", "monthly_gpu_hours",
            "user_daily_cap_gpu_hours", "max_booking_hours", "min_notice_minutes",
            "max_days_ahead", "requires_approval", "usage",
        ]
        read_only_fields = ["id", "name", "slug", "role", "usage"]
        # Bounds that keep the booking rules' date arithmetic inside year 9999.
        extra_kwargs = {"max_days_ahead": {"max_value": 36500}, "max_booking_hours": {"max_value": 24 * 36500},
                        "min_notice_minutes": {"max_value": 60 * 24 * 3650},
                        "time_zone": {"help_text": "An IANA time zone name, e.g. Europe/Berlin."}}

    def get_role(self, team: Team) -> str | None:
        return self.context["roles"].get(team.pk, "admin" if self.context["is_admin"] else None)

    def get_usage(self, team: Team) -> dict:
        return self.context["usage"](team)


class BookingPlacementQuerySerializer(serializers.Serializer):
    """`GET /api/v1/booking-placement/`: how many GPUs of one node, for which slot."""

    gpus = serializers.IntegerField(min_value=1, max_value=MAX_GPUS_PER_BOOKING)
    start = AwareDateTimeField()
    end = AwareDateTimeField()
