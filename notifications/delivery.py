"""Draining the outbox: send due deliveries, record the outcome, schedule retries.

Called by the Celery tasks (right after a commit, and periodically) and by the embedded
scheduler loop, always outside a transaction (STYLE.md habit 4). Each delivery is claimed
with a conditional UPDATE on the version it was read at (habit 3), so two loops running at
once never send one delivery concurrently; a claim is a lease (`next_attempt_at` moves to its
expiry), so a sender that dies mid-send is repaired by the next loop after the lease: delivery
is at-least-once, and receivers de-duplicate on the stable delivery id.
"""

import dataclasses
import datetime as dt
import logging
import random
import time

from django.conf import settings
from django.db import connection
from django.db.models import Q

from notifications.models import Delivery
from notifications.services import notices_schedule_reminders
from notifications.transports import PermanentError, TransportError, transport_for

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class DeliverySummary:
    delivered: int = 0
    retrying: int = 0
    failed: int = 0
    lost_claims: int = 0  # another sender claimed the row first
    deferred: int = 0  # left for the next run: its target just failed, or time ran out

    @property
    def attempted(self) -> int:
        return self.delivered + self.retrying + self.failed


def _max_attempts() -> int:
    return settings.GPUBOOK_NOTIFY_MAX_ATTEMPTS


def _claim_seconds() -> int:
    return settings.GPUBOOK_NOTIFY_CLAIM_SECONDS


def retry_delay(attempt: int, *, rng: random.Random | None = None) -> dt.timedelta:
    """Exponential backoff with "equal jitter": half the step fixed, half random, so
    receivers coming back up are not hit by every sender at the same instant."""
    base = settings.GPUBOOK_NOTIFY_RETRY_BASE_SECONDS
    cap = settings.GPUBOOK_NOTIFY_RETRY_MAX_SECONDS
    step = min(cap, base * 2 ** max(0, attempt - 1))
    return dt.timedelta(seconds=step / 2 + (rng or random).uniform(0, step / 2))


def delivery_claim(*, delivery_id, state: str, attempts: int, now: dt.datetime) -> bool:
    """Compare-and-set: take the delivery if it is still as we read it and still due."""
    return (
        Delivery.objects.filter(pk=delivery_id, state=state, attempts=attempts, next_attempt_at__lte=now).update(
            state=Delivery.State.SENDING,
            attempts=attempts + 1,
            next_attempt_at=now + dt.timedelta(seconds=_claim_seconds()),
        )
        == 1
    )


def _record(delivery_id, claimed_attempts: int, **fields) -> None:
    # Only while our claim stands: if the lease lapsed and another sender took over, its
    # outcome wins.
    updated = Delivery.objects.filter(pk=delivery_id, state=Delivery.State.SENDING, attempts=claimed_attempts).update(
        **fields
    )
    if not updated:
        logger.warning("delivery %s: claim lapsed before the outcome was recorded", delivery_id)


def _attempt(delivery_id, claimed_attempts: int, now: dt.datetime, summary: DeliverySummary) -> bool:
    """Send once and record the outcome. True if the target looked unreachable (worth not
    calling again in this run); a delivered or permanently refused one is not."""
    delivery = Delivery.objects.select_related("notice", "user", "webhook").get(pk=delivery_id)
    try:
        transport_for(delivery.channel).send(delivery)
    except PermanentError as error:
        _record(delivery_id, claimed_attempts, state=Delivery.State.FAILED, last_error=str(error)[:2000])
        summary.failed += 1
        return False
    except TransportError as error:
        message = str(error)
    except Exception as error:  # a bug in a template or transport must not stop the loop
        logger.exception("delivery %s: unexpected error", delivery_id)
        message = f"{type(error).__name__}: {error}"
    else:
        _record(delivery_id, claimed_attempts, state=Delivery.State.DELIVERED, delivered_at=now, last_error="")
        summary.delivered += 1
        return False
    message = f"attempt {claimed_attempts - delivery.attempts_before_resend}: {message}"[:2000]
    if claimed_attempts - delivery.attempts_before_resend >= _max_attempts():
        _record(delivery_id, claimed_attempts, state=Delivery.State.FAILED, last_error=message)
        summary.failed += 1
        logger.warning("delivery %s to %s failed for good: %s", delivery_id, delivery.target, message)
    else:
        _record(
            delivery_id,
            claimed_attempts,
            state=Delivery.State.PENDING,
            next_attempt_at=now + retry_delay(claimed_attempts - delivery.attempts_before_resend),
            last_error=message,
        )
        summary.retrying += 1
    return True


def deliver_due(now: dt.datetime, *, notice_id=None, limit: int = 200) -> DeliverySummary:
    """Send every delivery that is due at `now` (pending, or claimed by a sender whose lease
    ran out), oldest first, at most `limit`. Returns what happened.

    A dead receiver costs one timeout per run, not one per queued delivery: after a target
    (one webhook, or the mail server) fails, its other deliveries wait for the next run. And
    the run stops claiming after GPUBOOK_NOTIFY_BATCH_SECONDS, so a loop that also does other
    work is never held up for long.
    """
    if connection.in_atomic_block:
        raise RuntimeError("deliver_due() talks to the network; call it outside a transaction")
    due = Delivery.objects.filter(Q(state__in=Delivery.DUE_STATES), next_attempt_at__lte=now)
    if notice_id is not None:
        due = due.filter(notice_id=notice_id)
    candidates = list(
        due.order_by("next_attempt_at", "created_at").values_list("pk", "state", "attempts", "channel", "webhook_id")[
            :limit
        ]
    )
    budget_ends = time.monotonic() + settings.GPUBOOK_NOTIFY_BATCH_SECONDS
    troubled: set[tuple[str, int | None]] = set()
    summary = DeliverySummary()
    for delivery_id, state, attempts, channel, webhook_id in candidates:
        target = (channel, webhook_id)
        if target in troubled:
            summary.deferred += 1
            continue
        if time.monotonic() > budget_ends:
            summary.deferred += 1
            continue
        if not delivery_claim(delivery_id=delivery_id, state=state, attempts=attempts, now=now):
            summary.lost_claims += 1
            continue
        if _attempt(delivery_id, attempts + 1, now, summary):
            troubled.add(target)
    return summary


def notifications_run_once(*, now: dt.datetime) -> dict:
    """One iteration of the embedded loop / the periodic Celery task: emit due reminders,
    then drain the outbox."""
    reminders = notices_schedule_reminders(now=now)
    summary = deliver_due(now)
    return {"reminders": reminders, **dataclasses.asdict(summary)}
