"""Every notice type renders through every channel. Each event is produced by the code that
produces it in the app (booking services, the reminder scheduler, the run state machine, the
reconcile notices, the watchdog) — never a hand-written payload — then rendered as the email
(subject, text, HTML) and the webhook body."""

import datetime as dt
import json
import types

import pytest
from django.utils import timezone

import scheduler
from notifications.models import EventType, Notice
from notifications.services import notices_schedule_reminders
from notifications.transports.email import render_email
from notifications.transports.webhook import webhook_body
from reservations import approvals, waitlist
from reservations import services as bookings
from reservations.models import Membership, Reservation, Team
from tests.factories import fill_samples, make_job, make_reservation, make_run
from tests.fakes.executor import FakeExecutor
from training import reconcile, run_state, watchdog
from training.models import Run

H = dt.timedelta(hours=1)
MIN = dt.timedelta(minutes=1)


def produce_every_event(people, inventory, future_day, settings):
    now = timezone.now()
    owner, vision = people["owner"], people["vision"]
    vision.monthly_gpu_hours = 10
    vision.save()
    gpu = inventory["a"][0]
    start = future_day + 9 * H

    # reservation.confirmed, then quota.warning (8 of 10 GPU-hours) and quota.exhausted
    booking = bookings.reservation_create(user=owner, team=vision, gpu_ids=[gpu.pk], start=start, end=start + 8 * H,
                                          now=now, note="<b>fine-tune</b>")
    bookings.reservation_reschedule(reservation_id=booking.pk, actor=owner, now=now, end=start + 9 * H)  # changed
    second = bookings.reservation_create(user=owner, team=vision, gpu_ids=[inventory["a"][1].pk], start=start,
                                         end=start + H, now=now)
    bookings.reservation_cancel(reservation_id=second.pk, actor=owner, now=now)  # cancelled
    notices_schedule_reminders(now=start - 10 * MIN)  # reminder
    bookings.reservation_release(reservation_id=booking.pk, actor=owner, now=start + H + MIN, reason="done early")

    # reservation.idle: the watchdog on a live booking whose GPUs stay idle
    settings.GPUBOOK_SLOT_MINUTES = 30
    past = timezone.now().replace(second=0, microsecond=0) - 2 * H
    vision.idle_release, vision.idle_threshold_percent, vision.idle_minutes = False, 10, 30
    vision.save()
    idle = make_reservation(user=owner, team=vision, gpus=inventory["b"], start=past, end=past + 4 * H,
                            status=Reservation.Status.ACTIVE)
    for node_gpu in inventory["b"]:
        fill_samples(node_gpu, past, 40, utilization=0.01)
    watchdog.check_idle_reservations(now=past + 35 * MIN, summary=watchdog.WatchdogSummary())
    assert Notice.objects.filter(event_type=EventType.RESERVATION_IDLE).exists(), idle

    # run.*: the run state machine and reconcile's level-triggered notices
    job = make_job(user=owner, team=vision, submitted_at=now - 3 * H, name="detector <v3>")
    run = make_run(job=job, gpus=inventory["a"][2:4], started_at=now - H, must_end_by=now + 5 * MIN)
    Run.objects.filter(pk=run.pk).update(progress={"event": "epoch", "epoch": 3, "mAP50": 0.41, "box_loss": 1.2})
    run.refresh_from_db()
    run_state.notify_run(run, EventType.RUN_STARTED, now=now)
    reconcile.notify_progress(now=now, policy=types.SimpleNamespace(grace_s=60))  # run.ending_soon, job.waiting
    watchdog.run_stop_for_anomaly(run=run, reason="loss jumped 5x", now=now)  # run.anomaly
    for state in (Run.State.SUCCEEDED, Run.State.FAILED, Run.State.CHECKPOINTED):
        other = make_run(job=make_job(user=owner, team=vision, submitted_at=now, state="running"),
                         gpus=inventory["a"][2:3], started_at=now - H)
        run_state.run_end(other, state=state, reason=f"ended {state}", exit_code=0, now=now)
    # run.preempted: reconcile applies the plan's priority-preemption stop to a backfill run
    victim = make_run(job=make_job(user=owner, team=vision, submitted_at=now - 2 * H, state="running", priority="low"),
                      gpus=inventory["a"][2:3], started_at=now - H, kind=Run.Kind.BACKFILL)
    taker = make_job(user=owner, team=vision, submitted_at=now, priority="urgent", name="hotfix <b>")
    reconcile.apply_action(
        scheduler.Stop(run_id=victim.pk, reason=scheduler.Reason.PRIORITY_PREEMPTION, grace_s=60,
                       kill_at=now + MIN, for_job_id=taker.pk),
        executor=FakeExecutor(), now=now, report=reconcile.TickReport(),
    )
    job_waiting = make_job(user=owner, team=vision, submitted_at=now - 5 * H, name="waits")
    reconcile.notify_progress(now=now, policy=types.SimpleNamespace(grace_s=60))

    # approvals: reservation.awaiting_approval (to the managers), reservation.rejected (to the booker)
    lab = Team.objects.create(name="lab", slug="lab", monthly_gpu_hours=100, requires_approval=True)
    tiny = Team.objects.create(name="tiny", slug="tiny", monthly_gpu_hours=1)
    Membership.objects.create(user=people["teammate"], team=lab)
    Membership.objects.create(user=people["manager"], team=lab, role=Membership.Role.MANAGER)
    Membership.objects.create(user=people["manager"], team=tiny)
    spare = inventory["a"][3]
    pending = bookings.reservation_create(user=people["teammate"], team=lab, gpu_ids=[spare.pk], start=start + 20 * H,
                                          end=start + 21 * H, now=now)
    approvals.reservation_reject(reservation_id=pending.pk, actor=people["manager"], reason="lab closed", now=now)

    # the waitlist: waitlist.slot_free, waitlist.booked, and waitlist.failed (over the quota)
    outsider, nlp = people["outsider"], people["nlp"]
    held = [bookings.reservation_create(user=outsider, team=nlp, gpu_ids=[spare.pk], start=start + hours * H,
                                        end=start + (hours + 2) * H, now=now) for hours in (30, 40)]
    waitlist.waitlist_join(user=owner, team=vision, gpu_ids=[spare.pk], start=held[0].start, end=held[0].end,
                           mode="notify", now=now)
    waitlist.waitlist_join(user=people["teammate"], team=lab, gpu_ids=[spare.pk], start=held[0].start,
                           end=held[0].end, mode="book", now=now)
    waitlist.waitlist_join(user=people["manager"], team=tiny, gpu_ids=[spare.pk], start=held[1].start,
                           end=held[1].end, mode="book", now=now)
    for booking_held in held:
        bookings.reservation_cancel(reservation_id=booking_held.pk, actor=outsider, now=now)
    assert waitlist.waitlist_run_once(now=now) == {"expired": 0, "notified": 1, "booked": 1, "failed": 1}
    return job_waiting


@pytest.mark.django_db
def test_every_event_type_renders_as_email_and_webhook(people, inventory, future_day, settings):
    produce_every_event(people, inventory, future_day, settings)
    produced = set(Notice.objects.values_list("event_type", flat=True))
    assert produced == set(EventType.values), f"not produced: {set(EventType.values) - produced}"
    owner = people["owner"]
    for notice in Notice.objects.order_by("event_type"):
        subject, text, html = render_email(notice, owner)
        label = EventType(notice.event_type).label
        assert subject.strip() and text.strip() and html.strip(), notice.event_type
        assert "None" not in text and "{{" not in text and "{%" not in html, (notice.event_type, text)
        assert "<b>" not in html and "<v3>" not in html, (notice.event_type, "payload text must be escaped in HTML")
        assert label in html or label in subject, notice.event_type
        if notice.event_type == "run.started" or "reservation" in notice.payload:
            assert "GPU" in text and "GPU" in html, (notice.event_type, text)  # ids or {"id", "index"}
        body = json.loads(webhook_body(notice))
        assert body["type"] == notice.event_type and body["payload"] == notice.payload
        assert body["id"] == str(notice.pk)
