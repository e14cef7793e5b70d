"""Celery tasks. Thin: each calls one function that the embedded loop calls too.

- notifications.deliver_notice: enqueued after the commit that wrote a notice, for
  immediate delivery. Losing it (no broker) is harmless: the periodic task finds the rows.
- notifications.run_once: periodic (beat, every ~10 s): reminders, then every due delivery.
"""

from celery import shared_task
from django.utils import timezone

from notifications.delivery import deliver_due, notifications_run_once
from notifications.services import DELIVER_NOTICE_TASK


@shared_task(name=DELIVER_NOTICE_TASK, ignore_result=True)
def deliver_notice(notice_id: str) -> dict:
    summary = deliver_due(timezone.now(), notice_id=notice_id)
    return {"delivered": summary.delivered, "retrying": summary.retrying, "failed": summary.failed}


@shared_task(name="notifications.run_once", ignore_result=True)
def run_once() -> dict:
    return notifications_run_once(now=timezone.now())
