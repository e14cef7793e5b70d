"""The watchdog: act on what telemetry and the runners' metrics show, once per tick.

`watchdog_tick(now=)` is level-triggered and idempotent like reconcile; call it right after
each reconcile tick (Celery beat, the embedded loop). It does two things:

**Idle bookings.** A booking whose slot is running and whose GPUs have all stayed under the
team's `idle_threshold_percent` for the team's last `idle_minutes` full minutes is idle. Its
owner is told once. If the team has `idle_release` on, and none of the booking's own runs is
live, the rest of the slot (from the next slot edge) is released and refunded, and backfill
may use it (reservation_release, `actor=None`: the scheduler). A booking with a live run is
never released here: its run's deadline is its slot end, and the owner knows best whether a
stalled run is worth keeping. Telemetry must cover at least 90 % of the window's GPU-minutes:
missing figures are never read as idle.

**Anomalies during a run.** A running run whose training loss became NaN/infinite, whose
latest epoch loss jumped far above its recent level (GPUBOOK_ANOMALY_LOSS_JUMP_FACTOR × the
median of the previous GPUBOOK_ANOMALY_LOSS_WINDOW epochs), or whose GPU ran hotter than
GPUBOOK_ANOMALY_TEMPERATURE_CELSIUS over the last full minute is asked to stop with a
checkpoint: compare-and-set to STOPPING with `stop_requested_at`, `kill_at` and a reason
sentence (shown on the run page); reconcile's repair step delivers the stop and records the
end. The runner drops non-finite numbers from its reports, so a loss that was reported by the
previous epoch and is missing from the latest one counts as non-finite.
"""

import dataclasses
import datetime as dt
import logging
import math
import statistics

from django.conf import settings
from django.db.models import Count, F, Q, Window
from django.db.models.functions import RowNumber

from config.errors import DomainError
from gpus.models import GpuSample
from notifications import services as notices
from notifications.models import EventType
from reservations import services as reservation_services
from reservations import timegrid
from reservations.models import Reservation
from training.models import Run, RunMetric, TrainingJob
from training.run_state import run_request_stop

logger = logging.getLogger(__name__)
IDLE_COVERAGE = 0.9  # share of the window's GPU-minutes that must have telemetry
IDLE_EVENT = EventType.RESERVATION_IDLE
ANOMALY_EVENT = EventType.RUN_ANOMALY


@dataclasses.dataclass
class WatchdogSummary:
    idle: list[int] = dataclasses.field(default_factory=list)  # reservations found idle this tick
    notified: list[int] = dataclasses.field(default_factory=list)  # reservations whose owner was told
    released: list[int] = dataclasses.field(default_factory=list)  # reservations released for idleness
    stopped: dict[int, str] = dataclasses.field(default_factory=dict)  # run id → reason
    errors: list[str] = dataclasses.field(default_factory=list)


def _floor_minute(moment: dt.datetime) -> dt.datetime:
    return moment.astimezone(dt.UTC).replace(second=0, microsecond=0)


def watchdog_tick(*, now: dt.datetime) -> WatchdogSummary:
    summary = WatchdogSummary()
    if settings.GPUBOOK_IDLE_DETECTION:
        check_idle_reservations(now=now, summary=summary)
    if settings.GPUBOOK_ANOMALY_STOP:
        check_run_anomalies(now=now, summary=summary)
    return summary


# --- notices -------------------------------------------------------------------------------------
def _emit(*, event_type: str, team_id: int, user_id: int, payload: dict, now: dt.datetime, dedupe_key: str) -> bool:
    """The one call site for the watchdog's own notices."""
    return notices.notice_emit(
        event_type=event_type, team_id=team_id, payload=payload, recipients=[user_id], now=now, dedupe_key=dedupe_key
    ) is not None


# --- idle bookings -------------------------------------------------------------------------------
def idle_window(reservation: Reservation, *, now: dt.datetime) -> tuple[dt.datetime, dt.datetime] | None:
    """The full minutes the idle rule looks at, or None while the slot is younger than them."""
    end = _floor_minute(now)
    start = end - dt.timedelta(minutes=reservation.team.idle_minutes)
    if start < reservation.start or reservation.team.idle_minutes <= 0:
        return None
    return start, end


def idle_reservations(live: list[tuple[Reservation, list[int]]], *, now: dt.datetime) -> set[int]:
    """The ids of the live bookings (each with its GPU ids) whose GPUs stayed under their
    team's threshold for the team's window. The window and threshold are the team's, so one
    query per distinct pair among the teams — a handful — not one per booking (issue #19).
    A GPU is in at most one live booking, so its figures belong to that booking."""
    groups: dict[tuple, list[tuple[Reservation, list[int]]]] = {}
    for reservation, gpu_ids in live:
        window = idle_window(reservation, now=now)
        if window is not None and gpu_ids:
            key = (window, reservation.team.idle_threshold_percent / 100.0)
            groups.setdefault(key, []).append((reservation, gpu_ids))
    idle = set()
    for (window, threshold), members in groups.items():
        figures = {
            row["gpu_id"]: row
            for row in GpuSample.objects.filter(
                gpu_id__in=[gpu_id for _, gpu_ids in members for gpu_id in gpu_ids],
                minute__gte=window[0], minute__lt=window[1], utilization_mean__isnull=False,
            )
            .values("gpu_id")
            .annotate(seen=Count("id"), busy=Count("id", filter=Q(utilization_mean__gte=threshold)))
            .order_by()
        }
        for reservation, gpu_ids in members:
            seen = sum(figures[gpu_id]["seen"] for gpu_id in gpu_ids if gpu_id in figures)
            busy = sum(figures[gpu_id]["busy"] for gpu_id in gpu_ids if gpu_id in figures)
            expected = reservation.team.idle_minutes * len(gpu_ids)
            if busy == 0 and seen >= math.ceil(IDLE_COVERAGE * expected):
                idle.add(reservation.pk)
    return idle


def check_idle_reservations(*, now: dt.datetime, summary: WatchdogSummary) -> None:
    live = (
        Reservation.objects.filter(
            status__in=(Reservation.Status.CONFIRMED, Reservation.Status.ACTIVE), start__lte=now, end__gt=now
        )
        .select_related("team", "user", "node")
        .prefetch_related("booked")
        .order_by("start", "id")
    )
    slot_minutes = settings.GPUBOOK_SLOT_MINUTES
    live = [(reservation, sorted(row.gpu_id for row in reservation.booked.all())) for reservation in live]
    idle = idle_reservations(live, now=now)
    for reservation, gpu_ids in live:
        if reservation.pk not in idle:
            continue
        summary.idle.append(reservation.pk)
        team = reservation.team
        sentence = (
            f"its GPUs stayed under {team.idle_threshold_percent} % utilization for {team.idle_minutes} minutes"
        )
        has_live_run = Run.objects.filter(reservation=reservation, state__in=Run.LIVE).exists()
        next_edge = timegrid.ceil_to_slot(now, slot_minutes=slot_minutes)
        if team.idle_release and not has_live_run and next_edge < reservation.end:
            try:
                reservation_services.reservation_release(
                    reservation_id=reservation.pk, actor=None, now=now,
                    reason=f"Released automatically: {sentence}.",
                )
            except DomainError as error:  # released or cancelled meanwhile: nothing to do
                summary.errors.append(f"reservation {reservation.pk}: {error.detail}")
                continue
            summary.released.append(reservation.pk)  # the release notice tells the owner
            continue
        refund_hint = "" if not team.idle_release else " It was not released because a run of it is still live."
        told = _emit(
            event_type=IDLE_EVENT, team_id=team.pk, user_id=reservation.user_id, now=now,
            dedupe_key=f"reservation:{reservation.pk}:idle",
            payload={
                "reservation": {"id": reservation.pk, "team": {"id": team.pk, "name": team.name},
                                "node": reservation.node.name, "gpus": gpu_ids,
                                "start": reservation.start.isoformat(), "end": reservation.end.isoformat()},
                "reason": f"Your booking is idle: {sentence}.{refund_hint}",
                "idle_minutes": team.idle_minutes,
                "threshold_percent": team.idle_threshold_percent,
            },
        )
        if told:
            summary.notified.append(reservation.pk)


# --- anomalies -----------------------------------------------------------------------------------
def _is_train_loss(key: str) -> bool:
    return (key == "loss" or key.endswith("_loss")) and not key.startswith("val_")


def _non_finite(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in {"nan", "inf", "-inf", "+inf", "infinity", "-infinity"}
    return isinstance(value, float) and not math.isfinite(value)


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def loss_anomaly(*, epochs: list[dict], progress: dict) -> str | None:
    """A sentence if the losses look broken, else None. `epochs`: the run's epoch reports'
    values, oldest first; `progress`: its latest progress event."""
    latest_values = [epochs[-1]] if epochs else []
    if progress.get("event") in ("batch", "epoch"):
        latest_values.append(progress)
    for values in latest_values:
        for key, value in sorted(values.items()):
            if _is_train_loss(key) and _non_finite(value):
                return f"Stopped: the training loss {key} became {value} (not a number)."
    if len(epochs) >= 2:
        vanished = sorted(
            key for key, value in epochs[-2].items()
            if _is_train_loss(key) and _number(value) is not None and key not in epochs[-1]
        )
        if vanished:
            return f"Stopped: the training loss {vanished[0]} became NaN or infinite (no longer reported)."
    window = settings.GPUBOOK_ANOMALY_LOSS_WINDOW
    factor = settings.GPUBOOK_ANOMALY_LOSS_JUMP_FACTOR
    if len(epochs) < 4:  # at least three earlier epochs make a "recent level"
        return None
    latest = epochs[-1]
    for key in sorted(latest):
        value = _number(latest[key])
        if not _is_train_loss(key) or value is None:
            continue
        earlier = [_number(values.get(key)) for values in epochs[-1 - window:-1]]
        earlier = [item for item in earlier if item is not None]
        if len(earlier) < 3:
            continue
        level = statistics.median(earlier)
        if level > 0 and value > factor * level:
            return (
                f"Stopped: the training loss {key} jumped to {value:.4g}, over {factor:g}× its recent level "
                f"({level:.4g}, the median of the previous {len(earlier)} epochs)."
            )
    return None


def hot_gpus(*, gpu_ids: set[int], now: dt.datetime) -> dict[int, float]:
    """GPU id → temperature for GPUs over the limit in the last full minute with figures."""
    limit = settings.GPUBOOK_ANOMALY_TEMPERATURE_CELSIUS
    latest: dict[int, float] = {}
    recent = GpuSample.objects.filter(
        gpu_id__in=gpu_ids, minute__gte=_floor_minute(now) - dt.timedelta(minutes=2), minute__lt=_floor_minute(now),
        temperature_celsius_mean__isnull=False,
    ).order_by("gpu_id", "minute")
    for gpu_id, temperature in recent.values_list("gpu_id", "temperature_celsius_mean"):
        latest[gpu_id] = temperature
    return {gpu_id: temperature for gpu_id, temperature in latest.items() if temperature > limit}


def latest_epochs(*, run_ids: list[int], count: int) -> dict[int, list[dict]]:
    """Run id → the values of its last `count` epoch metrics, oldest first. One query for all
    the running runs (issue #19: it was one per run, every tick)."""
    newest_first = Window(RowNumber(), partition_by=F("run_id"), order_by=F("id").desc())
    rows = (
        RunMetric.objects.filter(run_id__in=run_ids, event="epoch")
        .annotate(newest=newest_first)
        .filter(newest__lte=count)
        .order_by("run_id", "id")
        .values_list("run_id", "values")
    )
    epochs: dict[int, list[dict]] = {}
    for run_id, values in rows:
        epochs.setdefault(run_id, []).append(values)
    return epochs


def check_run_anomalies(*, now: dt.datetime, summary: WatchdogSummary) -> None:
    # The job (with its specs) is read only for a run that is stopped.
    runs = list(Run.objects.filter(state=Run.State.RUNNING, stop_requested_at__isnull=True).order_by("id"))
    if not runs:
        return
    window = settings.GPUBOOK_ANOMALY_LOSS_WINDOW
    hot = hot_gpus(gpu_ids={gpu_id for run in runs for gpu_id in run.gpu_ids}, now=now)
    limit = settings.GPUBOOK_ANOMALY_TEMPERATURE_CELSIUS
    epochs = latest_epochs(run_ids=[run.pk for run in runs], count=window + 1)
    for run in runs:
        reason = loss_anomaly(epochs=epochs.get(run.pk, []), progress=run.progress or {})
        # A diverged loss would diverge again from the same checkpoint: hold the job for its
        # owner. A hot GPU is not the job's fault: it resumes in its next slot.
        hold_job = reason is not None
        if reason is None:
            too_hot = sorted((gpu_id, hot[gpu_id]) for gpu_id in run.gpu_ids if gpu_id in hot)
            if too_hot:
                gpu_id, temperature = too_hot[0]
                index = run.gpu_indices[run.gpu_ids.index(gpu_id)] if gpu_id in run.gpu_ids else gpu_id
                reason = (f"Stopped: GPU {index} reached {temperature:.0f} °C, over the {limit:g} °C limit; "
                          "the run was checkpointed to protect the hardware.")
        if reason is not None and run_stop_for_anomaly(run=run, reason=reason, now=now, hold_job=hold_job):
            summary.stopped[run.pk] = reason


def run_stop_for_anomaly(*, run: Run, reason: str, now: dt.datetime, hold_job: bool = False) -> bool:
    """Ask the run to checkpoint and stop (compare-and-set; reconcile delivers the stop).
    `hold_job`: the job ends as failed with the reason instead of being resumed."""
    grace = dt.timedelta(seconds=settings.GPUBOOK_STOP_GRACE_SECONDS)
    kill_at = min(now + grace, run.must_end_by) if run.must_end_by else now + grace
    if not run_request_stop(run_id=run.pk, now=now, kill_at=kill_at, reason=reason, only_running=True):
        return False
    job = run.job
    if hold_job:
        TrainingJob.objects.filter(pk=job.pk).exclude(state__in=TrainingJob.FINISHED).update(
            state=TrainingJob.State.FAILED, reason=f"Held after an anomaly: {reason}"[:500], finished_at=now
        )
    _emit(
        event_type=ANOMALY_EVENT, team_id=job.team_id, user_id=job.user_id, now=now,
        dedupe_key=f"run:{run.pk}:anomaly",
        payload={"run": {"id": run.pk}, "job": {"id": job.pk, "name": job.name}, "reason": reason,
                 "kill_at": kill_at.isoformat()},
    )
    return True
