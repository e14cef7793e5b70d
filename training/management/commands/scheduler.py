"""The embedded scheduler loop (`make run`): a scheduler tick, then the other rooms' periodic
work (GPU telemetry of this host, notification delivery), then sleep until the plan's next
wake-up or the tick interval, whichever is sooner. Production uses Celery beat instead."""

import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.utils import timezone

from gpus.telemetry.hooks import telemetry_tick
from notifications.delivery import notifications_run_once
from training.execution import executor_from_settings
from training.logs import logs_collect
from training.loop import scheduler_tick

# Each takes `now`; Celery runs the same work as separate beat tasks.
EMBEDDED_HOOKS = [telemetry_tick, lambda now: notifications_run_once(now=now), lambda now: logs_collect(now=now)]


class Command(BaseCommand):
    help = "Run the scheduler loop in this process (embedded mode)."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="run one tick and exit")

    def handle(self, *args, once: bool, **options):
        executor = executor_from_settings()
        tick = settings.GPUBOOK_TICK_SECONDS
        self.stdout.write(f"scheduler: {executor.kind} executor, tick {tick} s")
        due = None
        while True:
            now = timezone.now()
            report = scheduler_tick(now=now, executor=executor, due=due)
            for hook in EMBEDDED_HOOKS:
                hook(now)
            for name in ("started", "stopped", "killed", "released", "ended", "errors"):
                if getattr(report, name):
                    self.stdout.write(f"{now:%H:%M:%S} {name}: {getattr(report, name)}")
            if once:
                return
            wait, due = float(tick), None
            if report.next_wakeup is not None:
                until = (report.next_wakeup - timezone.now()).total_seconds()
                if until < wait:
                    wait, due = max(0.0, until), report.next_wakeup
            time.sleep(wait)
