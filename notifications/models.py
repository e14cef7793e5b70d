"""The notifications outbox.

A `Notice` is written in the same transaction as the change it reports, so it exists exactly
when the change committed. Each notice fans out, in that same transaction, into one `Delivery`
per channel target (an email to one user, a POST to one team webhook). Deliveries are sent
after commit by whoever gets to them first — the on-commit Celery task or the periodic loop —
and each is claimed with a compare-and-set so no two senders send it at the same time.

Teams are referenced by a lazy model string, not an import: reservations calls notifications,
never the other way round (DESIGN.md "Rooms").
"""

import secrets
import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q


class EventType(models.TextChoices):
    RESERVATION_CONFIRMED = "reservation.confirmed", "Booking confirmed"
    RESERVATION_CHANGED = "reservation.changed", "Booking changed"
    RESERVATION_CANCELLED = "reservation.cancelled", "Booking cancelled"
    RESERVATION_RELEASED = "reservation.released", "Booking released early"
    RESERVATION_REMINDER = "reservation.reminder", "Booking starts soon"
    RESERVATION_IDLE = "reservation.idle", "Booked GPUs idle"
    RUN_STARTED = "run.started", "Run started"
    RUN_ENDING_SOON = "run.ending_soon", "Slot ending soon"
    RUN_FINISHED = "run.finished", "Run finished"
    RUN_CHECKPOINTED = "run.checkpointed", "Run checkpointed"
    RUN_FAILED = "run.failed", "Run failed"
    RUN_ANOMALY = "run.anomaly", "Run stopped for an anomaly"
    RUN_PREEMPTED = "run.preempted", "Run stopped to make room for other jobs"
    QUOTA_WARNING = "quota.warning", "Team quota 80 % used"
    QUOTA_EXHAUSTED = "quota.exhausted", "Team quota used up"
    JOB_WAITING = "job.waiting", "Job waiting in the queue"
    RESERVATION_AWAITING_APPROVAL = "reservation.awaiting_approval", "Booking waits for approval"
    RESERVATION_REJECTED = "reservation.rejected", "Booking rejected"
    WAITLIST_SLOT_FREE = "waitlist.slot_free", "A slot you waited for is free"
    WAITLIST_BOOKED = "waitlist.booked", "Booked from the waitlist"
    WAITLIST_FAILED = "waitlist.failed", "Waitlist booking failed"


def new_webhook_secret() -> str:
    return secrets.token_urlsafe(32)


class Notice(models.Model):
    """One thing that happened, as receivers will see it: {id, type, time, payload}."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    event_type = models.CharField(max_length=40, choices=EventType.choices)
    team = models.ForeignKey(
        "reservations.Team", null=True, blank=True, on_delete=models.CASCADE, related_name="notices"
    )
    occurred_at = models.DateTimeField()
    payload = models.JSONField(default=dict)
    # Level-triggered callers (reconcile, the reminder sweep) may report the same fact twice;
    # a key makes the second emit a no-op. Null means "always a new notice".
    dedupe_key = models.CharField(max_length=200, null=True, blank=True, unique=True)

    class Meta:
        ordering = ["-occurred_at"]
        indexes = [models.Index(fields=["team", "occurred_at"])]

    def __str__(self) -> str:
        return f"{self.event_type} at {self.occurred_at:%Y-%m-%d %H:%M}"


class Delivery(models.Model):
    """One notice to one target. Its id is stable across retries and resends, so a receiver
    that sees it twice (at-least-once delivery) can drop the copy."""

    class Channel(models.TextChoices):
        EMAIL = "email", "Email"
        WEBHOOK = "webhook", "Webhook"

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        SENDING = "sending", "Sending"  # claimed; `next_attempt_at` is when the claim lapses
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Failed"

    DUE_STATES = (State.PENDING, State.SENDING)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    notice = models.ForeignKey(Notice, on_delete=models.CASCADE, related_name="deliveries")
    channel = models.CharField(max_length=16, choices=Channel.choices)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    webhook = models.ForeignKey(
        "notifications.Webhook", null=True, blank=True, on_delete=models.CASCADE, related_name="deliveries"
    )
    target = models.CharField(max_length=500, help_text="The address or URL when the delivery was written.")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    # Each claim increments `attempts`; the claim is a conditional UPDATE on the value read, so
    # `attempts` doubles as the row's version for compare-and-set.
    attempts = models.PositiveIntegerField(default=0)
    # `attempts` at the last resend: the retry limit counts attempts after it, while
    # `attempts` itself only ever grows (a version must never repeat).
    attempts_before_resend = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "deliveries"
        indexes = [models.Index(fields=["state", "next_attempt_at"])]
        constraints = [
            models.CheckConstraint(
                condition=(Q(channel="email", user__isnull=False) | Q(channel="webhook")),
                name="delivery_email_has_user",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.channel} → {self.target} ({self.state})"


class NotificationPreference(models.Model):
    """What one user wants by email. Missing row = the defaults (everything, email on)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_preference"
    )
    email_enabled = models.BooleanField(default=True)
    # Stored as the events turned off, so an event type added later reaches people by default.
    muted_events = models.JSONField(default=list, blank=True)

    def __str__(self) -> str:
        return f"notification preferences of {self.user}"

    def wants(self, event_type: str) -> bool:
        return self.email_enabled and event_type not in self.muted_events


class Webhook(models.Model):
    """A team's HTTPS endpoint. It receives only that team's notices, signed with its secret."""

    team = models.ForeignKey("reservations.Team", on_delete=models.CASCADE, related_name="webhooks")
    url = models.URLField(max_length=500)
    secret = models.CharField(max_length=100, default=new_webhook_secret)
    # Empty = every event type.
    events = models.JSONField(default=list, blank=True)
    enabled = models.BooleanField(default=True)
    description = models.CharField(max_length=200, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team", "id"]

    def __str__(self) -> str:
        return f"{self.team}: {self.url}"

    def wants(self, event_type: str) -> bool:
        return self.enabled and (not self.events or event_type in self.events)
