from celery import shared_task
from django.utils import timezone

from reservations.waitlist import waitlist_run_once


@shared_task(name="reservations.waitlist_run_once")
def waitlist_tick() -> dict[str, int]:
    return waitlist_run_once(now=timezone.now())
