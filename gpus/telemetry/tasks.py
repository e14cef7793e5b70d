"""Celery wiring for telemetry in production: beat runs `gpus.telemetry.tick` every minute or
so. With PROMETHEUS_URL it imports DCGM figures; otherwise (agents post samples) it only
prunes old buckets — set GPUBOOK_TELEMETRY_LOCAL=false there, a worker is not a GPU host."""

from celery import shared_task
from django.utils import timezone

from gpus.telemetry.hooks import telemetry_tick


@shared_task(name="gpus.telemetry.tick", ignore_result=True)
def telemetry_tick_task() -> None:
    telemetry_tick(timezone.now())
