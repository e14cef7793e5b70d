"""One scheduler tick, the same for Celery and the embedded loop: reconcile, then the
watchdog (idle bookings, run anomalies), then record how long it took and how late it began,
then — when due — the queue's stored estimates.

The embedded loop (`manage.py scheduler`) repeats ticks with `run_until_stopped`; SIGTERM
(or Ctrl-C) only sets a flag, so the tick under way always finishes before the loop returns."""

import contextlib
import datetime as dt
import signal
import time
from collections.abc import Callable, Iterator

from config.scheduling import policy_from_settings
from gpus.metrics import observe_tick
from training.executors.base import Executor
from training.queue import queue_estimates_refresh
from training.reconcile import TickReport, reconcile
from training.watchdog import watchdog_tick

# How often a sleeping loop looks at the stop flag: a stop waits at most this long.
STOP_CHECK_S = 0.25


def scheduler_tick(*, now: dt.datetime, executor: Executor, due: dt.datetime | None = None) -> TickReport:
    """`due`: when this tick was meant to run (an ETA tick's slot edge); None for a beat tick."""
    began = time.monotonic()
    report = reconcile(now=now, executor=executor)
    if report.skipped:
        return report
    watchdog_tick(now=now)
    lateness = (now - due).total_seconds() if due is not None else 0.0
    observe_tick(duration_s=time.monotonic() - began, lateness_s=lateness, now=now)
    # Outside reconcile's lock and after the tick is timed: rolling the queue forward costs
    # seconds on a large cluster (BENCHMARKS.md, "Cost of one estimate") and must never delay
    # a slot edge. It reads a fresh snapshot and writes only the estimate columns, so two
    # overlapping refreshes (beat and ETA ticks) at worst repeat work.
    queue_estimates_refresh(now=now, policy=policy_from_settings())
    return report


class StopRequest:
    """A stop asked for by a signal. The handler only sets `requested`; nothing is
    interrupted, the loop looks at the flag between ticks."""

    def __init__(self) -> None:
        self.requested = False

    def _on_signal(self, signum, frame) -> None:
        self.requested = True

    @classmethod
    @contextlib.contextmanager
    def on_signals(cls) -> Iterator["StopRequest"]:
        """Handle SIGTERM and SIGINT with the flag while inside; restore the old handlers after."""
        stop = cls()
        previous = {signum: signal.signal(signum, stop._on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield stop
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def sleep(self, seconds: float) -> None:
        """Sleep `seconds`, or less if a stop is requested meanwhile."""
        deadline = time.monotonic() + seconds
        while not self.requested:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, STOP_CHECK_S))


def run_until_stopped(*, run_once: Callable[[], float], stop: StopRequest) -> int:
    """Call `run_once()` (one whole tick; it returns how long to sleep before the next) until
    a stop is requested. A stop never cuts a tick short. Returns how many ticks ran."""
    ticks = 0
    while not stop.requested:
        wait = run_once()
        ticks += 1
        stop.sleep(wait)
    return ticks
