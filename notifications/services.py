"""Writing notices. Every function here only writes rows — it never sends anything — so it is
safe (and meant) to be called inside the transaction of the change it reports: if that
transaction rolls back, the notice and its deliveries vanish with it.

Callers: reservations.services (booking lifecycle and quota), the training reconcile (runs,
queue wait), the periodic loop (reminders), admin and the API (preferences, webhooks, resend).
"""

import datetime as dt
import functools
import logging
from collections.abc import Iterable

from celery import current_app
from django.apps import apps
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import F, Prefetch, QuerySet, prefetch_related_objects

from config.batch import fetch_together, insert
from config.errors import DomainError, ErrorCode, NotPermitted
from notifications import links
from notifications.models import Delivery, EventType, Notice, NotificationPreference, Webhook
from notifications.transports.webhook.targets import UnresolvableTarget, UnsafeTarget, check_url

logger = logging.getLogger(__name__)

RUN_EVENTS = frozenset(
    {
        EventType.RUN_STARTED,
        EventType.RUN_ENDING_SOON,
        EventType.RUN_FINISHED,
        EventType.RUN_CHECKPOINTED,
        EventType.RUN_FAILED,
        EventType.RUN_PREEMPTED,
    }
)
DELIVER_NOTICE_TASK = "notifications.deliver_notice"  # notifications.tasks.deliver_notice
# A quota position's level (reservations.selectors.QuotaPosition.level) → the notice it raises.
QUOTA_EVENTS = {"warning": EventType.QUOTA_WARNING, "exhausted": EventType.QUOTA_EXHAUSTED}


def _permissions():
    """The one permission layer, reservations.selectors. Imported when called: this room sits
    below reservations (it imports nothing of it at load), as the module docstring says."""
    from reservations import selectors

    return selectors


# --- the outbox ---------------------------------------------------------------------------


def notice_emit(
    *,
    event_type: str,
    team_id: int | None,
    payload: dict,
    recipients: Iterable[int],
    now: dt.datetime,
    dedupe_key: str | None = None,
    targets: list[list[dict]] | None = None,
) -> Notice | None:
    """Write a notice and one pending delivery per target: an email to each recipient who
    wants this event, a POST to each enabled webhook of `team_id` that wants it. `targets`:
    the rows of `delivery_targets_query(recipients, team_id)` when the caller read them already.

    Returns None when `dedupe_key` was already used (the fact was reported before). Delivery
    starts after the surrounding transaction commits; the periodic loop is the safety net.
    """
    if event_type not in EventType.values:
        raise ValueError(f"unknown event type {event_type!r}")
    fields = {"event_type": event_type, "team_id": team_id, "occurred_at": now, "payload": payload}
    if dedupe_key is None:
        notice = Notice(**fields)
        insert([notice])
    else:
        if Notice.objects.filter(dedupe_key=dedupe_key).exists():
            return None
        try:
            with transaction.atomic():  # a savepoint: losing a dedupe race must not doom the caller
                notice = Notice.objects.create(**fields, dedupe_key=dedupe_key)
        except IntegrityError:
            return None

    people, webhooks = targets or fetch_together(*delivery_targets_query(recipients=recipients, team_id=team_id))
    deliveries = [
        Delivery(
            notice=notice, channel=Delivery.Channel.EMAIL, user_id=person["id"], target=person["email"],
            next_attempt_at=now, created_at=now,
        )
        for person in people
        if person["email"] and _preference(person).wants(event_type)
    ]
    deliveries += [
        Delivery(
            notice=notice, channel=Delivery.Channel.WEBHOOK, webhook_id=hook["id"], target=hook["url"],
            next_attempt_at=now, created_at=now,
        )
        for hook in webhooks
        if Webhook(enabled=True, events=hook["events"]).wants(event_type)
    ]
    insert(deliveries)
    if deliveries:
        transaction.on_commit(functools.partial(_enqueue, notice.pk))
    return notice


def delivery_targets_query(*, recipients: Iterable[int], team_id: int | None) -> tuple[QuerySet, QuerySet]:
    """The reads `notice_emit` makes to address a notice: the active recipients with their
    email preferences, and the team's enabled webhooks. A caller that has other reads to make
    sends these with them (config.batch.fetch_together) and passes the rows as `targets`."""
    ids = sorted({user_id for user_id in recipients if user_id is not None})
    people = get_user_model().objects.filter(pk__in=ids, is_active=True).order_by("pk").values(
        "id", "email", "notification_preference__email_enabled", "notification_preference__muted_events"
    )
    webhooks = Webhook.objects.filter(team_id=team_id, enabled=True).order_by("id").values("id", "url", "events")
    return people, webhooks


def _preference(person: dict) -> NotificationPreference:
    """A recipient's preferences (the defaults when they never saved any), so the one rule
    `NotificationPreference.wants` decides."""
    if person["notification_preference__email_enabled"] is None:
        return NotificationPreference()
    return NotificationPreference(
        email_enabled=person["notification_preference__email_enabled"],
        muted_events=person["notification_preference__muted_events"],
    )


def _enqueue(notice_id) -> None:
    """After commit: hand the notice to a Celery worker for immediate delivery. Failing here
    (no Redis) loses nothing — the periodic loop finds the pending deliveries."""
    if not settings.GPUBOOK_NOTIFY_ENQUEUE:
        return
    try:
        # By its registered name: notifications.tasks imports delivery, which imports this
        # module, so importing the task here would close a cycle.
        current_app.tasks[DELIVER_NOTICE_TASK].apply_async(args=[str(notice_id)], retry=False)
    except Exception:  # the broker being down must never break the request that booked
        logger.warning("could not enqueue notice %s; the periodic loop will deliver it", notice_id, exc_info=True)


# --- reservations ---------------------------------------------------------------------------
# These take a reservation object but do not import the reservations app: reservations
# calls notifications, never the reverse.


def _reservation_payload(reservation) -> dict:
    # Through the prefetch cache: a booking just written carries its rows and GPUs already.
    prefetch_related_objects([reservation], Prefetch("booked", queryset=_booked_rows().select_related("gpu")))
    booked = sorted(reservation.booked.all(), key=lambda row: row.gpu.index)
    return {
        "reservation": {
            "id": reservation.pk,
            "team": {"id": reservation.team_id, "name": reservation.team.name},
            "user": reservation.user.get_username(),
            "node": reservation.node.name,
            "gpus": [{"id": row.gpu_id, "index": row.gpu.index} for row in booked],
            "gpu_count": reservation.gpu_count,
            "start": reservation.start.isoformat(),
            "end": reservation.end.isoformat(),
            "status": reservation.status,
            "note": reservation.note,
        },
        "url": links.reservation_url(reservation.pk),
    }


def _booked_rows():
    return apps.get_model("reservations", "ReservationGpu").objects.all()


def _notify_reservation(*, reservation, event_type: str, now: dt.datetime, extra: dict | None = None,
                        dedupe_key: str | None = None, targets: list[list[dict]] | None = None) -> Notice | None:
    return notice_emit(
        event_type=event_type,
        team_id=reservation.team_id,
        payload={**_reservation_payload(reservation), **(extra or {})},
        recipients=[reservation.user_id],
        now=now,
        dedupe_key=dedupe_key,
        targets=targets,
    )


def notify_reservation_confirmed(*, reservation, now: dt.datetime,
                                 targets: list[list[dict]] | None = None) -> Notice | None:
    """A booking is confirmed (at creation, or when a manager approves it). A booking still
    waiting for approval is not confirmed and gets nothing yet. `targets`: the rows of
    `delivery_targets_query` for its booker and team, when the caller read them already."""
    if reservation.status == "pending":
        return notify_reservation_awaiting_approval(reservation=reservation, now=now)
    if reservation.status != "confirmed":
        return None
    return _notify_reservation(
        reservation=reservation, event_type=EventType.RESERVATION_CONFIRMED, now=now, targets=targets
    )


def notify_reservation_awaiting_approval(*, reservation, now: dt.datetime) -> Notice | None:
    """A booking in a team that requires approval waits: its managers hear of it (the
    approvals page lists it), with a link to decide."""
    membership = apps.get_model("reservations", "Membership")
    managers = membership.objects.filter(team_id=reservation.team_id, role="manager").values_list("user_id", flat=True)
    return notice_emit(
        event_type=EventType.RESERVATION_AWAITING_APPROVAL,
        team_id=reservation.team_id,
        payload={**_reservation_payload(reservation), "approvals_url": links.approvals_url()},
        recipients=list(managers),
        now=now,
    )


def notify_reservation_rejected(*, reservation, reason: str, decided_by: str, now: dt.datetime) -> Notice | None:
    """A manager turned a waiting booking down: the booker hears why."""
    return _notify_reservation(
        reservation=reservation, event_type=EventType.RESERVATION_REJECTED, now=now,
        extra={"reason": reason, "decided_by": decided_by},
    )


def notify_reservation_changed(*, reservation, before: dict, now: dt.datetime) -> Notice | None:
    """`before` is the audit snapshot taken before the change (start/end as ISO strings)."""
    if before.get("start") == reservation.start.isoformat() and before.get("end") == reservation.end.isoformat():
        return None  # nothing a person would notice changed
    previous = {"start": before.get("start"), "end": before.get("end")}
    return _notify_reservation(
        reservation=reservation, event_type=EventType.RESERVATION_CHANGED, now=now, extra={"previous": previous}
    )


def notify_reservation_cancelled(*, reservation, now: dt.datetime) -> Notice | None:
    refund = reservation.gpu_count * (reservation.end - reservation.start).total_seconds() / 3600
    return _notify_reservation(
        reservation=reservation,
        event_type=EventType.RESERVATION_CANCELLED,
        now=now,
        extra={"reason": reservation.release_reason, "refund_gpu_hours": round(refund, 2), "automatic": False},
    )


def notify_reservation_released(*, reservation, before: dict, automatic: bool, now: dt.datetime) -> Notice | None:
    """Early release, by a person or by the scheduler (`automatic`: no-show or job finished
    early). A release before the start cancels the booking; that is reported as cancelled."""
    old_start = dt.datetime.fromisoformat(before["start"])
    old_end = dt.datetime.fromisoformat(before["end"])
    kept = reservation.end if reservation.status != "cancelled" else old_start
    refund = reservation.gpu_count * max(0.0, (old_end - kept).total_seconds()) / 3600
    cancelled = reservation.status == "cancelled"
    event_type = EventType.RESERVATION_CANCELLED if cancelled else EventType.RESERVATION_RELEASED
    return _notify_reservation(
        reservation=reservation,
        event_type=event_type,
        now=now,
        extra={
            "reason": reservation.release_reason,
            "refund_gpu_hours": round(refund, 2),
            "automatic": automatic,
            "previous": {"start": before["start"], "end": before["end"]},
        },
    )


def notify_quota_crossing(*, team, before, after, now: dt.datetime, booker_id: int | None = None) -> Notice | None:
    """Report the highest quota line (warning, exhausted) that this change crossed. `before`
    and `after` are reservations.selectors.QuotaPosition values, which own the lines. Once per
    team, month, line and quota size: cancelling and rebooking around a line does not repeat it."""
    if not after.quota_gpu_s or after.crossed_percent <= before.crossed_percent:
        return None
    percent = after.crossed_percent
    figures = after.as_dict()
    quota = team.monthly_gpu_hours
    managers = _permissions().team_manager_ids(team_id=team.pk)
    return notice_emit(
        event_type=QUOTA_EVENTS[after.level],
        team_id=team.pk,
        payload={
            "team": {"id": team.pk, "name": team.name},
            "month": after.month,
            "percent": percent,
            "quota_gpu_hours": quota,
            "used_gpu_hours": figures["used_gpu_hours"],
            "remaining_gpu_hours": figures["remaining_gpu_hours"],
            "url": links.team_url(team.pk),
        },
        recipients=[*managers, booker_id],
        now=now,
        dedupe_key=f"quota:{team.pk}:{after.month}:{percent}:{quota}",
    )


def notices_schedule_reminders(*, now: dt.datetime) -> int:
    """Emit a reminder for each confirmed booking that starts within the reminder window.
    Idempotent: one reminder per booking and start time (a moved booking is reminded again).
    A booking made inside the window is skipped: its confirmation just told the booker."""
    minutes = settings.GPUBOOK_REMINDER_MINUTES
    if minutes <= 0:
        return 0
    window = dt.timedelta(minutes=minutes)
    reservation_model = apps.get_model("reservations", "Reservation")  # see the module docstring
    due = reservation_model.objects.filter(status="confirmed", start__gt=now, start__lte=now + window).select_related(
        "team", "user", "node"
    )
    emitted = 0
    for reservation in due:
        if reservation.created_at > reservation.start - window:
            continue
        key = f"reminder:{reservation.pk}:{reservation.start.isoformat()}"
        with transaction.atomic():
            notice = _notify_reservation(
                reservation=reservation,
                event_type=EventType.RESERVATION_REMINDER,
                now=now,
                extra={"minutes_before": minutes},
                dedupe_key=key,
            )
        emitted += notice is not None
    return emitted


# --- training (called by the lead's reconcile) ---------------------------------------------


def notify_run_event(
    *,
    run_id: int,
    event_type: str,
    team_id: int,
    user_id: int,
    payload: dict,
    now: dt.datetime,
    dedupe_key: str | None = "",
) -> Notice | None:
    """A run started / its slot ends soon / it finished, checkpointed or failed.

    `payload` is what the caller knows: e.g. {"job": {"id", "name"}, "gpus": [...],
    "must_end_by": iso, "reason": "...", "metrics": {"epoch": 12, "epochs": 100, "mAP50": ...}}.
    Reconcile is level-triggered, so by default each (run, event type) is reported once; pass
    `dedupe_key=None` to always emit, or a key of your own.
    """
    if event_type not in RUN_EVENTS:
        raise ValueError(f"{event_type!r} is not a run event")
    if dedupe_key == "":
        dedupe_key = f"run:{run_id}:{event_type}"
    return notice_emit(
        event_type=event_type,
        team_id=team_id,
        payload={**payload, "run": {**payload.get("run", {}), "id": run_id}, "url": links.run_url(run_id)},
        recipients=[user_id],
        now=now,
        dedupe_key=dedupe_key,
    )


def notify_job_waiting(
    *,
    job_id: int,
    team_id: int,
    user_id: int,
    waiting_since: dt.datetime,
    now: dt.datetime,
    payload: dict | None = None,
) -> Notice | None:
    """Call for every queued job on every tick: emits once, when the job has waited longer
    than GPUBOOK_QUEUE_WAIT_NOTICE_MINUTES since `waiting_since` (its submit or requeue time)."""
    threshold = dt.timedelta(minutes=settings.GPUBOOK_QUEUE_WAIT_NOTICE_MINUTES)
    if now - waiting_since < threshold:
        return None
    waited_minutes = int((now - waiting_since).total_seconds() // 60)
    return notice_emit(
        event_type=EventType.JOB_WAITING,
        team_id=team_id,
        payload={
            **(payload or {}),
            "job": {**(payload or {}).get("job", {}), "id": job_id},
            "waiting_since": waiting_since.isoformat(),
            "waited_minutes": waited_minutes,
            "url": links.job_url(job_id),
        },
        recipients=[user_id],
        now=now,
        dedupe_key=f"job:{job_id}:waiting:{waiting_since.isoformat()}",
    )


# --- preferences, webhooks, resend --------------------------------------------------------


def _manages_team(*, user, team_id: int) -> bool:
    return _permissions().user_can_manage_team(user=user, team_id=team_id)


def _check_event_list(events: list) -> list[str]:
    if not isinstance(events, list) or any(event not in EventType.values for event in events):
        raise DomainError(ErrorCode.UNKNOWN_EVENT, f"Events must be a list of: {', '.join(EventType.values)}.")
    return sorted(set(events))


def preference_update(
    *, user, email_enabled: bool | None = None, muted_events: list | None = None
) -> NotificationPreference:
    preference, _ = NotificationPreference.objects.get_or_create(user=user)
    if email_enabled is not None:
        preference.email_enabled = email_enabled
    if muted_events is not None:
        preference.muted_events = _check_event_list(muted_events)
    preference.save()
    return preference


def webhook_check_url(url: str) -> None:
    try:
        check_url(url)
    except UnsafeTarget as error:
        raise DomainError(ErrorCode.UNSAFE_WEBHOOK_URL, str(error)) from None
    except UnresolvableTarget:
        # A host that does not resolve now (DNS down, a name not yet published) is kept: every
        # delivery vets the address again and retries, and failures show in the admin.
        pass


def webhook_create(*, actor, team_id: int, url: str, events: list | None = None, description: str = "") -> Webhook:
    if not _manages_team(user=actor, team_id=team_id):
        raise NotPermitted(ErrorCode.NOT_PERMITTED, "Only a team manager or an admin may manage the team's webhooks.")
    webhook_check_url(url)
    return Webhook.objects.create(
        team_id=team_id, url=url, events=_check_event_list(events or []), description=description, created_by=actor
    )


def webhook_update(*, actor, webhook: Webhook, changes: dict) -> Webhook:
    if not _manages_team(user=actor, team_id=webhook.team_id):
        raise NotPermitted(ErrorCode.NOT_PERMITTED, "Only a team manager or an admin may manage the team's webhooks.")
    if "url" in changes:
        webhook_check_url(changes["url"])
        webhook.url = changes["url"]
    if "events" in changes:
        webhook.events = _check_event_list(changes["events"])
    for name in ("enabled", "description"):
        if name in changes:
            setattr(webhook, name, changes[name])
    if changes.get("rotate_secret"):
        webhook.secret = Webhook._meta.get_field("secret").default()
    webhook.save()
    return webhook


def webhook_delete(*, actor, webhook: Webhook) -> None:
    if not _manages_team(user=actor, team_id=webhook.team_id):
        raise NotPermitted(ErrorCode.NOT_PERMITTED, "Only a team manager or an admin may manage the team's webhooks.")
    webhook.delete()


def delivery_resend(*, delivery_ids: Iterable, now: dt.datetime) -> int:
    """Put finished deliveries (failed, or delivered and wanted again) back in the queue with a
    fresh retry budget. Same delivery id: receivers de-duplicate on it. A delivery being sent
    right now is left alone."""
    return Delivery.objects.filter(
        pk__in=list(delivery_ids), state__in=(Delivery.State.FAILED, Delivery.State.DELIVERED)
    ).update(
        state=Delivery.State.PENDING,
        attempts_before_resend=F("attempts"),
        next_attempt_at=now,
        delivered_at=None,
    )
