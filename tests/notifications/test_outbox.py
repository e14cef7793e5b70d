"""The outbox: written with the change, gone with a rollback, delivered after commit by the
task or by the loop (at-least-once, same delivery id), claimed by compare-and-set."""

import datetime as dt
import threading

import pytest
from django.db import connection, transaction

from notifications import delivery as delivery_module
from notifications.delivery import deliver_due, delivery_claim, notifications_run_once
from notifications.models import Delivery, EventType, Notice
from notifications.services import notice_emit
from tests.notifications.conftest import NOW, H, add_webhook
from tests.support import book

pytestmark = pytest.mark.django_db(transaction=True)


class Boom(Exception):
    pass


@pytest.fixture
def enqueued(settings, monkeypatch):
    """Record what would be handed to Celery after commit."""
    from notifications import tasks

    settings.GPUBOOK_NOTIFY_ENQUEUE = True
    calls: list[str] = []
    monkeypatch.setattr(tasks.deliver_notice, "apply_async", lambda args, **kwargs: calls.append(args[0]))
    return calls


def test_booking_writes_the_notice_and_its_deliveries_with_it(people_with_email, inventory, receivers):
    receiver = receivers()
    add_webhook(people_with_email["vision"], receiver)
    reservation = book(people_with_email["owner"], people_with_email["vision"], inventory["a"][:2], NOW + 2 * H, NOW + 3 * H, now=NOW)
    notice = Notice.objects.get()
    assert notice.event_type == EventType.RESERVATION_CONFIRMED
    assert notice.team_id == people_with_email["vision"].pk
    assert notice.payload["reservation"]["id"] == reservation.pk
    assert sorted(Delivery.objects.values_list("channel", "target", "state")) == [
        ("email", "alice@example.org", "pending"),
        ("webhook", receiver.url, "pending"),
    ]


def test_a_change_that_rolls_back_sends_nothing(people_with_email, inventory, smtp, receivers, enqueued):
    receiver = receivers()
    add_webhook(people_with_email["vision"], receiver)
    with pytest.raises(Boom), transaction.atomic():
        book(people_with_email["owner"], people_with_email["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
        assert Delivery.objects.count() == 2  # written inside the transaction...
        raise Boom
    assert Notice.objects.count() == 0 and Delivery.objects.count() == 0  # ...and gone with it
    assert enqueued == []
    assert deliver_due(NOW + 24 * H).attempted == 0
    assert smtp.messages == [] and receiver.requests == []


def test_delivery_is_enqueued_only_after_commit(people_with_email, inventory, enqueued):
    with transaction.atomic():
        book(people_with_email["owner"], people_with_email["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
        assert enqueued == []
    assert enqueued == [str(Notice.objects.get().pk)]


def test_broker_down_does_not_break_the_booking_and_the_loop_delivers(
    people_with_email, inventory, smtp, settings, monkeypatch
):
    from notifications import tasks

    settings.GPUBOOK_NOTIFY_ENQUEUE = True

    def broker_down(*args, **kwargs):
        raise ConnectionRefusedError("redis is down")

    monkeypatch.setattr(tasks.deliver_notice, "apply_async", broker_down)
    book(people_with_email["owner"], people_with_email["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
    assert Delivery.objects.get().state == Delivery.State.PENDING
    summary = deliver_due(NOW)
    assert summary.delivered == 1
    assert [message["to"] for message in smtp.messages] == [["alice@example.org"]]


def test_the_celery_task_delivers_one_notice(people_with_email, smtp):
    from django.utils import timezone

    from notifications.tasks import deliver_notice

    now = timezone.now()
    notice = notice_emit(
        event_type=EventType.JOB_WAITING, team_id=people_with_email["vision"].pk,
        payload={"job": {"id": 4, "name": "yolo11n-coco"}, "waited_minutes": 70, "url": "http://x/jobs/4/"},
        recipients=[people_with_email["owner"].pk], now=now,
    )
    assert deliver_notice(str(notice.pk)) == {"delivered": 1, "retrying": 0, "failed": 0}
    assert len(smtp.messages) == 1


def test_crash_between_commit_and_delivery_is_repaired_by_the_next_loop_run(
    people_with_email, inventory, smtp, receivers
):
    """The process that booked died before sending: the rows wait; the loop sends them."""
    receiver = receivers()
    add_webhook(people_with_email["vision"], receiver)
    book(people_with_email["owner"], people_with_email["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
    assert smtp.messages == [] and receiver.requests == []
    result = notifications_run_once(now=NOW + dt.timedelta(seconds=5))
    assert result["delivered"] == 2
    assert len(smtp.messages) == 1 and len(receiver.requests) == 1
    assert Delivery.objects.filter(state=Delivery.State.DELIVERED).count() == 2
    assert notifications_run_once(now=NOW + H)["delivered"] == 0  # nothing sent twice


def test_crash_after_sending_resends_with_the_same_delivery_id(
    people_with_email, inventory, receivers, settings, monkeypatch
):
    """A sender dies after the POST but before recording it: the claim lapses and the next
    loop sends again (at-least-once) with the same X-Gpubook-Delivery, so the receiver can
    drop the copy."""
    settings.GPUBOOK_NOTIFY_CLAIM_SECONDS = 120
    people_with_email["owner"].email = ""
    people_with_email["owner"].save()
    receiver = receivers()
    add_webhook(people_with_email["vision"], receiver)
    book(people_with_email["owner"], people_with_email["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
    real_record = delivery_module._record

    def crash(*args, **kwargs):
        raise Boom("worker killed")

    monkeypatch.setattr(delivery_module, "_record", crash)
    with pytest.raises(Boom):
        deliver_due(NOW)
    monkeypatch.setattr(delivery_module, "_record", real_record)
    row = Delivery.objects.get()
    assert row.state == Delivery.State.SENDING and len(receiver.requests) == 1

    assert deliver_due(NOW + dt.timedelta(seconds=60)).attempted == 0  # the claim still stands
    assert deliver_due(NOW + dt.timedelta(seconds=121)).delivered == 1  # it lapsed: resent
    assert receiver.delivery_ids == [str(row.pk), str(row.pk)]
    assert [request["json"]["id"] for request in receiver.requests] == [str(row.notice_id)] * 2
    assert Delivery.objects.get().state == Delivery.State.DELIVERED


def test_claim_is_compare_and_set(people_with_email):
    notice_emit(
        event_type=EventType.QUOTA_WARNING, team_id=None, payload={},
        recipients=[people_with_email["owner"].pk], now=NOW,
    )
    row = Delivery.objects.get()
    first = delivery_claim(delivery_id=row.pk, state=row.state, attempts=row.attempts, now=NOW)
    second = delivery_claim(delivery_id=row.pk, state=row.state, attempts=row.attempts, now=NOW)
    assert (first, second) == (True, False)
    row.refresh_from_db()
    assert (row.state, row.attempts) == (Delivery.State.SENDING, 1)
    # not due again until the claim lapses, however often the loop looks
    assert delivery_claim(delivery_id=row.pk, state=row.state, attempts=row.attempts, now=NOW + H / 60) is False


def test_a_loop_that_read_the_same_rows_late_sends_none_of_them(people, receivers, monkeypatch):
    """Deterministic interleaving of two loops: A reads the due rows, B runs in full, then A
    tries to claim what it read. Every one of A's claims must lose."""
    receiver = receivers()
    webhook = add_webhook(people["vision"], receiver)
    for _ in range(3):
        notice_emit(event_type=EventType.RUN_STARTED, team_id=webhook.team_id, payload={}, recipients=[], now=NOW)
    real_claim = delivery_module.delivery_claim
    other_loop: list = []

    def claim_after_the_other_loop(**kwargs):
        if not other_loop:
            monkeypatch.setattr(delivery_module, "delivery_claim", real_claim)
            other_loop.append(deliver_due(NOW))  # B, between A's read and A's first claim
            monkeypatch.setattr(delivery_module, "delivery_claim", claim_after_the_other_loop)
        return real_claim(**kwargs)

    monkeypatch.setattr(delivery_module, "delivery_claim", claim_after_the_other_loop)
    late = deliver_due(NOW)
    assert other_loop[0].delivered == 3
    assert (late.delivered, late.lost_claims) == (0, 3)
    assert len(receiver.delivery_ids) == 3 == len(set(receiver.delivery_ids))


@pytest.mark.postgres
def test_two_loops_at_once_never_send_a_delivery_twice(people_with_email, inventory, receivers):
    """Real threads on PostgreSQL (SQLite's in-memory test database cannot take concurrent
    writers; the interleaving test above covers the same race there)."""
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL for real concurrent writers")
    receiver = receivers()
    webhook = add_webhook(people_with_email["vision"], receiver)
    people_with_email["owner"].email = ""
    people_with_email["owner"].save()
    for _ in range(12):
        notice_emit(
            event_type=EventType.RUN_STARTED, team_id=webhook.team_id, payload={"run": {"id": 1}},
            recipients=[], now=NOW,
        )
    summaries = []
    barrier = threading.Barrier(2)

    def loop():
        try:
            barrier.wait()
            summaries.append(deliver_due(NOW))
        finally:
            connection.close()

    threads = [threading.Thread(target=loop) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(summary.delivered for summary in summaries) == 12
    assert len(receiver.delivery_ids) == 12 == len(set(receiver.delivery_ids))


def test_deliver_due_refuses_to_run_inside_a_transaction():
    with transaction.atomic(), pytest.raises(RuntimeError, match="outside a transaction"):
        deliver_due(NOW)


def test_dedupe_key_makes_a_repeat_emit_a_no_op(people_with_email):
    kwargs = dict(
        event_type=EventType.RUN_FINISHED, team_id=people_with_email["vision"].pk, payload={},
        recipients=[people_with_email["owner"].pk], now=NOW, dedupe_key="run:7:run.finished",
    )
    assert notice_emit(**kwargs) is not None
    with transaction.atomic():
        assert notice_emit(**kwargs) is None
    assert Notice.objects.count() == 1 and Delivery.objects.count() == 1


def test_unknown_event_type_is_a_programming_error(people):
    with pytest.raises(ValueError, match="unknown event type"):
        notice_emit(event_type="reservation.exploded", team_id=None, payload={}, recipients=[], now=NOW)
