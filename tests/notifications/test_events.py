"""Which changes emit which notices, with what payload and to whom; every event type renders
an email with a subject, both bodies and a link back."""

import datetime as dt

import pytest
from django.core import mail

from notifications.delivery import deliver_due
from notifications.models import Delivery, EventType, Notice
from notifications.services import (
    notices_schedule_reminders,
    notify_job_waiting,
    notify_run_event,
)
from notifications.transports.email import render_email
from reservations.models import Reservation
from reservations.services import (
    reservation_approve,
    reservation_cancel,
    reservation_release,
    reservation_reschedule,
)
from tests.notifications.conftest import NOW, H
from tests.support import book

pytestmark = pytest.mark.django_db


def only_notice(**filters) -> Notice:
    (notice,) = Notice.objects.filter(**filters)
    return notice


def recipients(notice: Notice) -> set[str]:
    return set(notice.deliveries.filter(channel="email").values_list("target", flat=True))


class TestReservationEvents:
    def test_reschedule_reports_old_and_new_times(self, people_with_email, inventory):
        reservation = book(people_with_email["owner"], people_with_email["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
        reservation_reschedule(
            reservation_id=reservation.pk, actor=people_with_email["manager"], now=NOW,
            start=NOW + 4 * H, end=NOW + 6 * H,
        )
        notice = only_notice(event_type=EventType.RESERVATION_CHANGED)
        assert notice.payload["previous"] == {"start": (NOW + 2 * H).isoformat(), "end": (NOW + 3 * H).isoformat()}
        assert notice.payload["reservation"]["start"] == (NOW + 4 * H).isoformat()
        assert recipients(notice) == {"alice@example.org"}  # the booker, whoever changed it

    def test_cancel_reports_the_refund(self, people_with_email, inventory):
        reservation = book(people_with_email["owner"], people_with_email["vision"], inventory["a"][:2], NOW + 2 * H, NOW + 5 * H, now=NOW)
        reservation_cancel(reservation_id=reservation.pk, actor=people_with_email["owner"], now=NOW, reason="plans")
        notice = only_notice(event_type=EventType.RESERVATION_CANCELLED)
        assert notice.payload["refund_gpu_hours"] == 6
        assert notice.payload["reason"] == "plans"

    def test_automatic_release_reports_the_refund(self, people_with_email, inventory):
        reservation = book(people_with_email["owner"], people_with_email["vision"], inventory["a"][:2], NOW + 2 * H, NOW + 6 * H, now=NOW)
        reservation_release(reservation_id=reservation.pk, actor=None, now=NOW + 2 * H + dt.timedelta(minutes=20),
                            reason="no-show")
        notice = only_notice(event_type=EventType.RESERVATION_RELEASED)
        # kept until the end of the current slot (10:30); 3.5 h × 2 GPUs come back
        assert notice.payload["refund_gpu_hours"] == 7
        assert notice.payload["automatic"] is True
        assert notice.payload["reason"] == "no-show"
        assert notice.payload["reservation"]["status"] == Reservation.Status.RELEASED

    def test_release_before_the_start_is_reported_as_cancelled(self, people_with_email, inventory):
        reservation = book(people_with_email["owner"], people_with_email["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
        reservation_release(reservation_id=reservation.pk, actor=people_with_email["owner"], now=NOW, reason="")
        notice = only_notice(event_type=EventType.RESERVATION_CANCELLED)
        assert notice.payload["refund_gpu_hours"] == 1 and notice.payload["automatic"] is False

    def test_pending_bookings_are_confirmed_on_approval(self, people_with_email, inventory):
        team = people_with_email["vision"]
        team.requires_approval = True
        team.save()
        reservation = book(people_with_email["owner"], people_with_email["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
        assert not Notice.objects.filter(event_type=EventType.RESERVATION_CONFIRMED).exists()
        reservation_approve(reservation_id=reservation.pk, actor=people_with_email["manager"], now=NOW)
        assert recipients(only_notice(event_type=EventType.RESERVATION_CONFIRMED)) == {"alice@example.org"}

    def test_a_refused_booking_emits_nothing(self, people_with_email, inventory):
        from config.errors import Conflict

        book(people_with_email["owner"], people_with_email["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
        with pytest.raises(Conflict):
            book(people_with_email["teammate"], people_with_email["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
        assert Notice.objects.count() == 1


class TestQuota:
    def test_crossing_80_then_100_percent_tells_managers_once_each(self, people_with_email, inventory):
        gpus = inventory["a"]  # 4 GPUs; vision has 100 GPU-hours a month
        day = NOW + 24 * H
        book(people_with_email["owner"], people_with_email["vision"], gpus, day, day + 18 * H, now=NOW)  # 72 %
        assert not Notice.objects.filter(event_type__startswith="quota.").exists()
        book(people_with_email["teammate"], people_with_email["vision"], gpus, day + 18 * H, day + 20 * H, now=NOW)  # 80 %
        warning = only_notice(event_type=EventType.QUOTA_WARNING)
        assert warning.payload["percent"] == 80 and warning.payload["used_gpu_hours"] == 80
        assert warning.payload["month"] == "2027-02"
        assert recipients(warning) == {"bob@example.org", "dave@example.org"}  # managers + the booker
        book(people_with_email["owner"], people_with_email["vision"], gpus, day + 20 * H, day + 25 * H, now=NOW)  # 100 %
        exhausted = only_notice(event_type=EventType.QUOTA_EXHAUSTED)
        assert exhausted.payload["remaining_gpu_hours"] == 0
        assert Notice.objects.filter(event_type__startswith="quota.").count() == 2

    def test_jumping_past_both_lines_reports_only_the_higher(self, people_with_email, inventory):
        day = NOW + 24 * H
        book(people_with_email["owner"], people_with_email["vision"], inventory["a"], day, day + 25 * H, now=NOW)
        assert list(Notice.objects.filter(event_type__startswith="quota.").values_list("event_type", flat=True)) == [
            EventType.QUOTA_EXHAUSTED
        ]

    def test_cancel_and_rebook_across_the_line_does_not_repeat(self, people_with_email, inventory):
        day = NOW + 24 * H
        book(people_with_email["owner"], people_with_email["vision"], inventory["a"], day, day + 18 * H, now=NOW)
        second = book(people_with_email["owner"], people_with_email["vision"], inventory["a"], day + 18 * H, day + 20 * H, now=NOW)
        reservation_cancel(reservation_id=second.pk, actor=people_with_email["owner"], now=NOW)
        book(people_with_email["owner"], people_with_email["vision"], inventory["a"], day + 18 * H, day + 20 * H, now=NOW)
        assert Notice.objects.filter(event_type=EventType.QUOTA_WARNING).count() == 1


class TestReminders:
    def test_one_reminder_per_booking_inside_the_window(self, people_with_email, inventory):
        reservation = book(people_with_email["owner"], people_with_email["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
        assert notices_schedule_reminders(now=NOW + 2 * H - dt.timedelta(minutes=16)) == 0  # not yet
        sweep = NOW + 2 * H - dt.timedelta(minutes=14)
        assert notices_schedule_reminders(now=sweep) == 1
        assert notices_schedule_reminders(now=sweep) == 0  # idempotent
        assert notices_schedule_reminders(now=sweep + dt.timedelta(minutes=5)) == 0
        notice = only_notice(event_type=EventType.RESERVATION_REMINDER)
        assert notice.payload["reservation"]["id"] == reservation.pk
        assert notice.payload["minutes_before"] == 15
        assert recipients(notice) == {"alice@example.org"}

    def test_a_moved_booking_is_reminded_again(self, people_with_email, inventory):
        reservation = book(people_with_email["owner"], people_with_email["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
        notices_schedule_reminders(now=NOW + 2 * H - dt.timedelta(minutes=10))
        reservation_reschedule(reservation_id=reservation.pk, actor=people_with_email["owner"],
                               now=NOW + H, start=NOW + 4 * H, end=NOW + 5 * H)
        assert notices_schedule_reminders(now=NOW + 4 * H - dt.timedelta(minutes=10)) == 1

    def test_skips_cancelled_started_and_just_made_bookings(self, people_with_email, inventory, settings):
        settings.GPUBOOK_REMINDER_MINUTES = 30
        cancelled = book(people_with_email["owner"], people_with_email["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
        reservation_cancel(reservation_id=cancelled.pk, actor=people_with_email["owner"], now=NOW)
        book(people_with_email["owner"], people_with_email["vision"], inventory["a"][1:2], NOW + 2 * H, NOW + 3 * H, now=NOW + 2 * H - dt.timedelta(minutes=20))  # booked inside the window
        book(people_with_email["owner"], people_with_email["vision"], inventory["a"][2:3], NOW + H, NOW + 2 * H, now=NOW)  # already begun at the sweep
        assert notices_schedule_reminders(now=NOW + 2 * H - dt.timedelta(minutes=10)) == 0

    def test_zero_minutes_turns_reminders_off(self, people_with_email, inventory, settings):
        settings.GPUBOOK_REMINDER_MINUTES = 0
        book(people_with_email["owner"], people_with_email["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
        assert notices_schedule_reminders(now=NOW + 2 * H - dt.timedelta(minutes=5)) == 0


class TestTrainingEvents:
    def test_run_events_are_reported_once_each(self, people_with_email):
        vision, owner = people_with_email["vision"], people_with_email["owner"]
        for event_type in (EventType.RUN_STARTED, EventType.RUN_STARTED, EventType.RUN_FAILED):
            notify_run_event(
                run_id=31, event_type=event_type, team_id=vision.pk, user_id=owner.pk, now=NOW,
                payload={"job": {"id": 9, "name": "yolo11n-coco"}, "reason": "CUDA out of memory",
                         "metrics": {"epoch": 12, "mAP50": 0.41}},
            )
        assert sorted(Notice.objects.values_list("event_type", flat=True)) == ["run.failed", "run.started"]
        failed = only_notice(event_type=EventType.RUN_FAILED)
        assert failed.payload["run"] == {"id": 31}
        assert failed.payload["url"].endswith("/runs/31/")
        assert failed.payload["metrics"] == {"epoch": 12, "mAP50": 0.41}

    def test_run_event_rejects_other_types(self, people):
        with pytest.raises(ValueError, match="not a run event"):
            notify_run_event(run_id=1, event_type=EventType.QUOTA_WARNING, team_id=people["vision"].pk,
                             user_id=people["owner"].pk, payload={}, now=NOW)

    def test_job_waiting_is_reported_once_past_the_threshold(self, people_with_email, settings):
        settings.GPUBOOK_QUEUE_WAIT_NOTICE_MINUTES = 60
        kwargs = dict(job_id=5, team_id=people_with_email["vision"].pk, user_id=people_with_email["owner"].pk,
                      waiting_since=NOW, payload={"job": {"name": "detect-ships"}})
        assert notify_job_waiting(now=NOW + dt.timedelta(minutes=59), **kwargs) is None
        notice = notify_job_waiting(now=NOW + dt.timedelta(minutes=61), **kwargs)
        assert notice.payload["waited_minutes"] == 61 and notice.payload["job"] == {"name": "detect-ships", "id": 5}
        assert notify_job_waiting(now=NOW + dt.timedelta(minutes=90), **kwargs) is None  # once
        # requeued later: a new wait, a new notice
        assert notify_job_waiting(now=NOW + 5 * H, **{**kwargs, "waiting_since": NOW + 3 * H}) is not None


EXAMPLE_PAYLOADS = {
    "reservation": lambda: {
        "reservation": {"id": 3, "team": {"id": 1, "name": "vision"}, "user": "alice", "node": "node-a",
                        "gpus": [{"id": 1, "index": 0}], "gpu_count": 1, "start": NOW.isoformat(),
                        "end": (NOW + H).isoformat(), "status": "confirmed", "note": ""},
        "previous": {"start": NOW.isoformat(), "end": (NOW + H).isoformat()},
        "refund_gpu_hours": 1.5, "reason": "no-show", "automatic": True, "minutes_before": 15,
        "url": "http://127.0.0.1:8000/reservations/3/",
    },
    "run": lambda: {"run": {"id": 8}, "job": {"id": 2, "name": "yolo11n"}, "reason": "exit 1",
                    "metrics": {"epoch": 3}, "must_end_by": NOW.isoformat(),
                    "url": "http://127.0.0.1:8000/runs/8/"},
    "quota": lambda: {"team": {"id": 1, "name": "vision"}, "month": "2027-02", "percent": 80,
                      "quota_gpu_hours": 100, "used_gpu_hours": 80, "remaining_gpu_hours": 20,
                      "url": "http://127.0.0.1:8000/teams/1/"},
    "job": lambda: {"job": {"id": 2, "name": "yolo11n"}, "waited_minutes": 75, "waiting_since": NOW.isoformat(),
                    "url": "http://127.0.0.1:8000/jobs/2/"},
    "waitlist": lambda: {"slot": {"node": "node-a", "gpus": [0], "gpu_ids": [1], "start": NOW.isoformat(),
                                  "end": (NOW + H).isoformat()},
                         "waitlist_entry": 4, "reservation_id": 9, "reason": "quota used up",
                         "url": "http://127.0.0.1:8000/calendar/"},
}


@pytest.mark.parametrize("event_type", EventType.values)
def test_every_event_type_renders_an_email(event_type, people):
    notice = Notice(event_type=event_type, occurred_at=NOW, payload=EXAMPLE_PAYLOADS[event_type.split(".")[0]]())
    subject, text, html = render_email(notice, people["owner"])
    label = EventType(event_type).label
    assert subject.startswith(f"[gpubook] {label}") and "\n" not in subject
    assert notice.payload["url"] in text and notice.payload["url"] in html
    assert "{{" not in text and "{%" not in html
    assert "Hello alice" in text


@pytest.mark.django_db(transaction=True)
def test_run_failure_email_carries_reason_and_metrics(people_with_email, mailoutbox):
    notify_run_event(
        run_id=77, event_type=EventType.RUN_FAILED, team_id=people_with_email["vision"].pk,
        user_id=people_with_email["owner"].pk, now=NOW,
        payload={"job": {"id": 9, "name": "yolo11n-coco"}, "reason": "CUDA out of memory",
                 "metrics": {"epoch": 12, "mAP50": 0.41}},
    )
    assert deliver_due(NOW).delivered == 1
    (message,) = mail.outbox
    assert message.subject == "[gpubook] Run failed: yolo11n-coco"
    assert "failed: CUDA out of memory" in message.body
    assert "mAP50: 0.41" in message.body and "epoch: 12" in message.body
    assert Delivery.objects.get().state == Delivery.State.DELIVERED
