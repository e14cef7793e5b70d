import secrets
import zoneinfo

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from gpus.models import Gpu, Node


def validate_time_zone(value: str) -> None:
    if value not in zoneinfo.available_timezones():
        raise ValidationError(f"{value!r} is not a known IANA time zone")


class Team(models.Model):
    """A group that shares a monthly GPU-hour quota. Months are calendar months in `time_zone`."""

    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=50, unique=True)
    time_zone = models.CharField(max_length=64, default="UTC", validators=[validate_time_zone])
    monthly_gpu_hours = models.PositiveIntegerField(
        default=0, help_text="GPU-hours the team may book per calendar month."
    )
    user_daily_cap_gpu_hours = models.PositiveIntegerField(
        null=True, blank=True, help_text="Optional: GPU-hours one member may book per day."
    )
    max_booking_hours = models.PositiveIntegerField(
        null=True, blank=True, help_text="Optional: longest single booking (wall-clock hours)."
    )
    min_notice_minutes = models.PositiveIntegerField(
        default=0, help_text="How long before its start a booking must be made."
    )
    max_days_ahead = models.PositiveIntegerField(
        default=60, help_text="How far ahead a booking may start."
    )
    requires_approval = models.BooleanField(
        default=False, help_text="Bookings wait for a team manager's approval."
    )
    fair_share = models.FloatField(
        null=True, blank=True, help_text="Scheduler share; proportional to the quota when empty."
    )
    idle_release = models.BooleanField(
        default=False,
        help_text="Release and refund the rest of a slot whose GPUs stay idle (backfill may use it).",
    )
    idle_threshold_percent = models.PositiveSmallIntegerField(
        default=10, help_text="A GPU under this utilization (%) counts as idle."
    )
    idle_minutes = models.PositiveSmallIntegerField(
        default=30, help_text="How long a booking's GPUs must stay idle before the owner is told (and it is released)."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def tzinfo(self) -> zoneinfo.ZoneInfo:
        return zoneinfo.ZoneInfo(self.time_zone)


class Membership(models.Model):
    class Role(models.TextChoices):
        MEMBER = "member", "Member"
        MANAGER = "manager", "Manager"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "user"], name="membership_unique_team_user")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class Reservation(models.Model):
    """One or more GPUs of one node booked for [start, end) on behalf of a team.

    `end` is the effective end: an early release moves it back, so quota usage is always
    gpu_count × (end − start) and the freed time is bookable again.
    """

    class Status(models.TextChoices):
        PENDING = "pending", "Pending approval"
        CONFIRMED = "confirmed", "Confirmed"
        ACTIVE = "active", "Active"
        COMPLETED = "completed", "Completed"
        CANCELLED = "cancelled", "Cancelled"
        RELEASED = "released", "Released early"

    # Every status but cancelled holds its GPUs for [start, end) and counts against the quota.
    OCCUPYING = (Status.PENDING, Status.CONFIRMED, Status.ACTIVE, Status.COMPLETED, Status.RELEASED)
    UPCOMING_OR_ACTIVE = (Status.PENDING, Status.CONFIRMED, Status.ACTIVE)

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="reservations"
    )
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="reservations")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="reservations")
    gpus = models.ManyToManyField(Gpu, through="ReservationGpu", related_name="reservations")
    gpu_count = models.PositiveSmallIntegerField()
    start = models.DateTimeField()
    end = models.DateTimeField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.CONFIRMED)
    note = models.CharField(max_length=500, blank=True)
    release_reason = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["start", "id"]
        indexes = [
            models.Index(fields=["team", "start"]),
            models.Index(fields=["user", "start"]),
            models.Index(fields=["start", "end"]),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(end__gt=models.F("start")), name="reservation_end_after_start")
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.team} {self.node} {self.start:%Y-%m-%d %H:%M}"

    @property
    def gpu_seconds(self) -> int:
        return self.gpu_count * int((self.end - self.start).total_seconds())


class ReservationGpu(models.Model):
    """One booked GPU of a reservation, with the reservation's time range copied in.

    The copy exists so PostgreSQL's exclusion constraint can say "no two occupying rows of
    the same GPU overlap" on one table (migration 0002); services keep it in step.
    """

    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="booked")
    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="booked")
    start = models.DateTimeField()
    end = models.DateTimeField()
    occupies = models.BooleanField(default=True)

    class Meta:
        indexes = [models.Index(fields=["gpu", "start", "end"])]
        constraints = [
            models.UniqueConstraint(fields=["reservation", "gpu"], name="reservationgpu_unique")
        ]

    def __str__(self) -> str:
        return f"reservation #{self.reservation_id} GPU {self.gpu_id}"


class AuditEntry(models.Model):
    """Who changed what, when, with the state before and after."""

    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    at = models.DateTimeField()
    action = models.CharField(max_length=50)
    reservation = models.ForeignKey(
        Reservation, null=True, blank=True, on_delete=models.CASCADE, related_name="audit_entries"
    )
    team = models.ForeignKey(
        Team, null=True, blank=True, on_delete=models.CASCADE, related_name="audit_entries"
    )
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M} {self.actor} {self.action}"


def new_calendar_token() -> str:
    return secrets.token_urlsafe(32)


class UserProfile(models.Model):
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="profile"
    )
    time_zone = models.CharField(max_length=64, default="UTC", validators=[validate_time_zone])
    calendar_token = models.CharField(max_length=64, unique=True, default=new_calendar_token)

    def __str__(self) -> str:
        return f"profile of {self.user}"


# --- recurring bookings and the waitlist (reservations/recurring.py, reservations/waitlist.py) ---


class ReservationSeries(models.Model):
    """"Every Tuesday 18:00–22:00 until 31 March": an RFC 5545 rule read in `time_zone`, so the
    wall-clock time holds across DST. Each occurrence is an ordinary Reservation, booked by
    the same service as a single booking; the ones that could not be booked are kept with why."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="reservation_series")
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="reservation_series")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="reservation_series")
    gpu_ids = models.JSONField()
    rule = models.CharField(max_length=500, help_text="RRULE, e.g. FREQ=WEEKLY;BYDAY=TU;UNTIL=20270331T235959Z")
    time_zone = models.CharField(max_length=64, validators=[validate_time_zone])
    first_start = models.DateTimeField()
    # Any two date-times apart (a 32-bit column held 68 years and 500'd past it): an absurd length
    # is refused occurrence by occurrence, like every booking rule, and the series kept with why.
    duration_s = models.PositiveBigIntegerField()
    note = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"series #{self.pk} {self.rule}"


class SeriesOccurrence(models.Model):
    series = models.ForeignKey(ReservationSeries, on_delete=models.CASCADE, related_name="occurrences")
    start = models.DateTimeField()
    reservation = models.OneToOneField(
        Reservation, null=True, blank=True, on_delete=models.SET_NULL, related_name="series_occurrence"
    )
    problem_code = models.CharField(max_length=50, blank=True)
    problem = models.CharField(max_length=500, blank=True, help_text="Why this date could not be booked.")

    class Meta:
        ordering = ["start"]
        constraints = [models.UniqueConstraint(fields=["series", "start"], name="seriesoccurrence_unique_start")]

    def __str__(self) -> str:
        return f"series #{self.series_id} at {self.start:%Y-%m-%d %H:%M}"


class WaitlistEntry(models.Model):
    """Someone who found a slot taken and asked to hear when it frees (`notify`) or to have it
    booked for them (`book`). First come, first served; an entry expires at the slot's start."""

    class Mode(models.TextChoices):
        NOTIFY = "notify", "Tell me when it frees"
        BOOK = "book", "Book it for me if it frees"

    class State(models.TextChoices):
        WAITING = "waiting", "Waiting"
        NOTIFIED = "notified", "Told it is free"
        BOOKED = "booked", "Booked"
        FAILED = "failed", "Could not be booked"
        EXPIRED = "expired", "Expired"
        CANCELLED = "cancelled", "Cancelled"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="waitlist_entries")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="waitlist_entries")
    gpu_ids = models.JSONField()
    start = models.DateTimeField()
    end = models.DateTimeField()
    mode = models.CharField(max_length=8, choices=Mode.choices)
    state = models.CharField(max_length=10, choices=State.choices, default=State.WAITING)
    note = models.CharField(max_length=500, blank=True)
    reservation = models.ForeignKey(
        Reservation, null=True, blank=True, on_delete=models.SET_NULL, related_name="from_waitlist"
    )
    outcome = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["state", "start"])]

    def __str__(self) -> str:
        return f"waitlist #{self.pk} {self.mode} {self.start:%Y-%m-%d %H:%M}"
