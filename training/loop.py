"""One scheduler tick, the same for Celery and the embedded loop: reconcile, then the
watchdog (idle bookings, run anomalies), then record how long it took and how late it began."""

import datetime as dt
import time

from gpus.metrics import observe_tick
from training.executors.base import Executor
from training.reconcile import TickReport, reconcile
from training.watchdog import watchdog_tick


def scheduler_tick(*, now: dt.datetime, executor: Executor, due: dt.datetime | None = None) -> TickReport:
    """`due`: when this tick was meant to run (an ETA tick's slot edge); None for a beat tick."""
    began = time.monotonic()
    report = reconcile(now=now, executor=executor)
    if report.skipped:
        return report
    watchdog_tick(now=now)
    lateness = (now - due).total_seconds() if due is not None else 0.0
    observe_tick(duration_s=time.monotonic() - began, lateness_s=lateness, now=now)
    return report
