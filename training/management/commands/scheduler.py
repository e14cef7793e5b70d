"""The embedded scheduler loop (`make run`): reconcile, then deliver notices, then sleep until
the plan's next wake-up or the tick interval, whichever is sooner. Production uses Celery."""

import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.utils import timezone

from training.execution import executor_from_settings
from training.reconcile import reconcile


class Command(BaseCommand):
    help = "Run the scheduler loop in this process (embedded mode)."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="run one tick and exit")

    def handle(self, *args, once: bool, **options):
        executor = executor_from_settings()
        tick = settings.GPUBOOK_TICK_SECONDS
        self.stdout.write(f"scheduler: {executor.kind} executor, tick {tick} s")
        while True:
            now = timezone.now()
            report = reconcile(now=now, executor=executor)
            for hook in EMBEDDED_HOOKS:
                hook(now)
            for name in ("started", "stopped", "killed", "released", "ended", "errors"):
                if getattr(report, name):
                    self.stdout.write(f"{now:%H:%M:%S} {name}: {getattr(report, name)}")
            if once:
                return
            wait = float(tick)
            if report.next_wakeup is not None:
                wait = min(wait, max(0.05, (report.next_wakeup - timezone.now()).total_seconds()))
            time.sleep(wait)


# Other rooms' periodic work that the embedded loop runs after each reconcile (notification
# delivery, reminders, telemetry); each takes `now`.
EMBEDDED_HOOKS: list = []
