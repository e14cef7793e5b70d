"""Celery tasks: thin wrappers that read the clock once and run one scheduler tick."""

import datetime as dt
import logging

import redis
from celery import shared_task
from django.conf import settings
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from training.execution import executor_from_settings
from training.loop import scheduler_tick

logger = logging.getLogger(__name__)
ETA_KEY = "gpubook:reconcile-eta:{}"


@shared_task(bind=True, name="training.tasks.reconcile_tick", ignore_result=True)
def reconcile_tick(self) -> None:
    eta = self.request.eta
    due = parse_datetime(eta) if isinstance(eta, str) else eta
    report = scheduler_tick(now=timezone.now(), executor=executor_from_settings(), due=due)
    if report.errors:
        logger.warning("reconcile errors: %s", report.errors)
    if report.next_wakeup is not None:
        schedule_wakeup(report.next_wakeup)


def schedule_wakeup(when: dt.datetime) -> bool:
    """Book one ETA tick for `when`, once: every beat tick sees the same next edge, and a
    Redis SET NX keeps them from booking it again."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    seconds = max(1, int((when - timezone.now()).total_seconds()) + 3600)
    if not client.set(ETA_KEY.format(when.isoformat()), "1", nx=True, ex=seconds):
        return False
    reconcile_tick.apply_async(eta=when)
    return True


@shared_task(name="training.tasks.collect_run_logs", ignore_result=True)
def collect_run_logs() -> None:
    """Keep the full log of every run that ended since the last pass (training/logs.py)."""
    from training.logs import logs_collect

    logs_collect(now=timezone.now())
