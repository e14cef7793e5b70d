"""The scheduler's policy as this deployment's settings make it: one place, read by the
scheduler tick (training), the queue estimates, the what-if replay and the booking service's
GPU choice (reservations.placement)."""

import math

from django.conf import settings

import scheduler


def policy_from_settings() -> scheduler.Policy:
    return scheduler.Policy(
        grace_s=float(settings.GPUBOOK_STOP_GRACE_SECONDS),
        no_show_after_s=float(settings.GPUBOOK_NO_SHOW_MINUTES * 60),
        usage_factor=settings.GPUBOOK_BACKFILL_USAGE_FACTOR,
        relief_after_s=float(settings.GPUBOOK_QUEUE_RELIEF_MINUTES * 60) or math.inf,
        drain_after_s=float(settings.GPUBOOK_QUEUE_DRAIN_MINUTES * 60) or math.inf,
        relief_budget_extra=settings.GPUBOOK_QUEUE_STOP_ALLOWANCE,
    )
