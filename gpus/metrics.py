"""/metrics in Prometheus text format, and the two recording hooks other rooms call.

Every figure is read from the database at scrape time (or from `MonitoringValue` rows that
the recording hooks write), never from process memory: gunicorn workers, Celery and the
embedded loop are separate processes, and whichever one Prometheus scrapes must report all.

Other rooms' tables are read through the app registry, not imports: `gpus` imports no other
room at load (DESIGN.md "Rooms"). The quota figures come from the one quota selector,
reservations.selectors.quota_positions, imported when a scrape asks for them.

Access: a bearer token (GPUBOOK_METRICS_TOKEN) or a client address inside
GPUBOOK_METRICS_ALLOWED_NETWORKS (default: none). The address is REMOTE_ADDR; behind
a reverse proxy, use the token.

Recording hooks:
- `observe_tick(duration_s=, lateness_s=, now=)` after each scheduler tick;
- `count_booking_conflict(code=, now=)` when a booking is refused for a conflict.
"""

import bisect
import datetime as dt
import hmac
import ipaddress
import logging
from collections import Counter

from django.apps import apps
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Count, F, Max, Min
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    SummaryMetricFamily,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gpus.models import Gpu, GpuSample, MonitoringValue

logger = logging.getLogger(__name__)
TELEMETRY_FRESH = dt.timedelta(minutes=5)  # older buckets are not "current" GPU figures
SLOT_LATENESS_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
LIVE_RESERVATION = ("confirmed", "active")
UPCOMING_RESERVATION = ("pending", "confirmed")

# MonitoringValue names
TICKS = "scheduler_ticks"
TICK_SECONDS_SUM = "scheduler_tick_seconds_sum"
LAST_TICK_DURATION = "scheduler_last_tick_duration_seconds"
LAST_TICK_LATENESS = "scheduler_last_tick_lateness_seconds"
LAST_TICK_AT = "scheduler_last_tick_timestamp_seconds"
BOOKING_CONFLICTS = "booking_conflicts"


# --- recording -----------------------------------------------------------------------------------
def _add(name: str, labels: str, delta: float, now: dt.datetime) -> None:
    for _ in range(2):
        if MonitoringValue.objects.filter(name=name, labels=labels).update(value=F("value") + delta, updated_at=now):
            return
        try:
            with transaction.atomic():
                MonitoringValue.objects.create(name=name, labels=labels, value=delta, updated_at=now)
            return
        except IntegrityError:
            continue  # another process created it first: add to theirs


def _set(values: dict[str, float], now: dt.datetime) -> None:
    MonitoringValue.objects.bulk_create(
        [MonitoringValue(name=name, labels="", value=value, updated_at=now) for name, value in values.items()],
        update_conflicts=True,
        unique_fields=["name", "labels"],
        update_fields=["value", "updated_at"],
    )


def observe_tick(*, duration_s: float, lateness_s: float, now: dt.datetime) -> None:
    """Record one scheduler tick: how long it took and how late it began (vs. when it was due)."""
    _set({LAST_TICK_DURATION: duration_s, LAST_TICK_LATENESS: max(0.0, lateness_s),
          LAST_TICK_AT: now.timestamp() + duration_s}, now)
    _add(TICKS, "", 1.0, now)
    _add(TICK_SECONDS_SUM, "", duration_s, now)


def count_booking_conflict(*, code: str, now: dt.datetime) -> None:
    """Count one refused booking (`code`: slot_conflict, quota_exceeded, …). Call it outside
    the booking transaction (it rolled back), e.g. where the error becomes a response."""
    _add(BOOKING_CONFLICTS, f"code={code}", 1.0, now)


# --- access ------------------------------------------------------------------------------------
def _allowed(request: HttpRequest) -> tuple[bool, int]:
    token = settings.GPUBOOK_METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer ") and hmac.compare_digest(header[7:].encode(), token.encode()):
        return True, 200
    networks = settings.GPUBOOK_METRICS_ALLOWED_NETWORKS
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        address = None
    if address is not None:
        for network in networks:
            try:
                if address in ipaddress.ip_network(network, strict=False):
                    return True, 200
            except ValueError:
                logger.error("GPUBOOK_METRICS_ALLOWED_NETWORKS: %r is not a network", network)
    return False, 401 if token else 403


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    allowed, status = _allowed(request)
    if not allowed:
        return HttpResponse("metrics: not allowed from here\n", status=status, content_type="text/plain")
    return HttpResponse(render_metrics(now=timezone.now()), content_type=CONTENT_TYPE_LATEST)


def render_metrics(*, now: dt.datetime) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(now))
    return generate_latest(registry)


class _Collector:
    def __init__(self, now: dt.datetime) -> None:
        self.now = now

    def collect(self):
        yield from gpu_families(now=self.now)
        yield from reservation_families(now=self.now)
        yield from queue_and_run_families(now=self.now)
        yield from scheduler_families(now=self.now)
        yield from quota_families(now=self.now)
        yield from notification_families()
        yield from deployment_families()


# --- families ----------------------------------------------------------------------------------
def gpu_families(*, now: dt.datetime):
    gpu_labels = ["node", "gpu", "uuid", "model"]
    info = GaugeMetricFamily("gpubook_gpu_info", "Every GPU gpubook manages (value 1).", labels=[*gpu_labels, "state"])
    figures = {
        "utilization_mean": GaugeMetricFamily(
            "gpubook_gpu_utilization_ratio", "GPU utilization over the last full minute (0–1).", labels=gpu_labels),
        "memory_used_bytes_mean": GaugeMetricFamily(
            "gpubook_gpu_memory_used_bytes", "GPU memory used, mean over the last full minute.", labels=gpu_labels),
        "memory_total_bytes": GaugeMetricFamily(
            "gpubook_gpu_memory_total_bytes", "GPU memory size.", labels=gpu_labels),
        "temperature_celsius_mean": GaugeMetricFamily(
            "gpubook_gpu_temperature_celsius", "GPU temperature, mean over the last full minute.", labels=gpu_labels),
        "power_watts_mean": GaugeMetricFamily(
            "gpubook_gpu_power_watts", "GPU power draw, mean over the last full minute.", labels=gpu_labels),
    }
    age = GaugeMetricFamily("gpubook_gpu_telemetry_age_seconds", "Seconds since the end of the newest telemetry "
                            "minute (absent: no telemetry in the last 5 minutes).", labels=gpu_labels)
    booked = GaugeMetricFamily("gpubook_gpu_booked", "1 if a booking holds the GPU now.", labels=gpu_labels)

    ReservationGpu = apps.get_model("reservations", "ReservationGpu")
    booked_now = set(
        ReservationGpu.objects.filter(occupies=True, start__lte=now, end__gt=now).values_list("gpu_id", flat=True)
    )
    latest: dict[int, GpuSample] = {}
    for sample in GpuSample.objects.filter(minute__gte=now - TELEMETRY_FRESH).order_by("gpu_id", "minute"):
        latest[sample.gpu_id] = sample
    for gpu in Gpu.objects.select_related("node").order_by("node__name", "index"):
        labels = [gpu.node.name, str(gpu.index), gpu.uuid, gpu.model_name]
        info.add_metric([*labels, gpu.state], 1)
        booked.add_metric(labels, 1 if gpu.pk in booked_now else 0)
        sample = latest.get(gpu.pk)
        if sample is None:
            continue
        age.add_metric(labels, max(0.0, (now - sample.minute).total_seconds() - 60))
        for field, family in figures.items():
            value = getattr(sample, field)
            if field == "memory_total_bytes" and value is None:
                value = gpu.memory_mib * 1024 * 1024
            if value is not None:
                family.add_metric(labels, float(value))
    yield info
    yield from figures.values()
    yield age
    yield booked


def reservation_families(*, now: dt.datetime):
    Reservation = apps.get_model("reservations", "Reservation")
    Team = apps.get_model("reservations", "Team")
    active = GaugeMetricFamily("gpubook_reservations_active", "Bookings whose slot is running now.", labels=["team"])
    upcoming = GaugeMetricFamily("gpubook_reservations_upcoming", "Bookings still to begin (confirmed or awaiting "
                                 "approval).", labels=["team"])
    running = Counter(
        Reservation.objects.filter(status__in=LIVE_RESERVATION, start__lte=now, end__gt=now)
        .values_list("team__slug", flat=True)
    )
    ahead = Counter(
        Reservation.objects.filter(status__in=UPCOMING_RESERVATION, start__gt=now).values_list("team__slug", flat=True)
    )
    for slug in Team.objects.order_by("slug").values_list("slug", flat=True):
        active.add_metric([slug], running.get(slug, 0))
        upcoming.add_metric([slug], ahead.get(slug, 0))
    yield active
    yield upcoming


def queue_and_run_families(*, now: dt.datetime):
    TrainingJob = apps.get_model("training", "TrainingJob")
    Run = apps.get_model("training", "Run")
    depth = GaugeMetricFamily("gpubook_queue_jobs", "Queued (backfill) jobs waiting for idle GPUs.",
                              labels=["priority", "team"])
    oldest = GaugeMetricFamily("gpubook_queue_oldest_job_age_seconds",
                               "Age of the oldest queued job, by priority (since submission).", labels=["priority"])
    queued = (
        TrainingJob.objects.filter(state="queued", reservation__isnull=True)
        .values("priority", "team__slug")
        .annotate(jobs=Count("id"), first=Min("submitted_at"))
        .order_by("priority", "team__slug")
    )
    first_by_priority: dict[str, dt.datetime] = {}
    for row in queued:
        depth.add_metric([row["priority"], row["team__slug"]], row["jobs"])
        current = first_by_priority.get(row["priority"])
        first_by_priority[row["priority"]] = row["first"] if current is None else min(current, row["first"])
    for priority, first in sorted(first_by_priority.items()):
        oldest.add_metric([priority], max(0.0, (now - first).total_seconds()))
    runs = GaugeMetricFamily("gpubook_runs", "Runs by state and kind (reserved, backfill).", labels=["state", "kind"])
    for row in Run.objects.values("state", "kind").annotate(n=Count("id")).order_by("state", "kind"):
        runs.add_metric([row["state"], row["kind"]], row["n"])
    yield depth
    yield oldest
    yield runs
    yield slot_lateness_family()


def slot_lateness_family():
    """How late each booking's own job started after the slot began. Only bookings whose job
    was waiting before the slot began count: a job attached late is not the scheduler's delay."""
    Run = apps.get_model("training", "Run")
    rows = (
        Run.objects.filter(kind="reserved", reservation__isnull=False, started_at__isnull=False,
                           job__submitted_at__lte=F("reservation__start"))
        .values("reservation_id")
        .annotate(first=Min("started_at"), slot=Max("reservation__start"))
        .order_by()
    )
    counts = [0] * (len(SLOT_LATENESS_BUCKETS) + 1)
    total = 0.0
    for row in rows:
        lateness = max(0.0, (row["first"] - row["slot"]).total_seconds())
        counts[bisect.bisect_left(SLOT_LATENESS_BUCKETS, lateness)] += 1
        total += lateness
    cumulative, buckets = 0, []
    for bound, count in zip([*map(str, SLOT_LATENESS_BUCKETS), "+Inf"], counts, strict=True):
        cumulative += count
        buckets.append((bound, cumulative))
    family = HistogramMetricFamily(
        "gpubook_slot_start_lateness_seconds", "Delay from a booking's slot start to its job's start.",
    )
    family.add_metric([], buckets, total)
    return family


def scheduler_families(*, now: dt.datetime):
    values = {(row.name, row.labels): row.value for row in MonitoringValue.objects.all()}
    duration = SummaryMetricFamily("gpubook_scheduler_tick_duration_seconds", "Time each scheduler tick took.")
    duration.add_metric([], values.get((TICKS, ""), 0.0), values.get((TICK_SECONDS_SUM, ""), 0.0))
    yield duration
    last_at = values.get((LAST_TICK_AT, ""))
    for name, key, text in (
        ("gpubook_scheduler_last_tick_duration_seconds", LAST_TICK_DURATION, "How long the last tick took."),
        ("gpubook_scheduler_tick_lateness_seconds", LAST_TICK_LATENESS,
         "How late the last tick began against its due time (beat interval or slot-edge ETA)."),
        ("gpubook_scheduler_last_tick_timestamp_seconds", LAST_TICK_AT, "Unix time the last tick finished."),
    ):
        family = GaugeMetricFamily(name, text)
        if (key, "") in values:
            family.add_metric([], values[(key, "")])
        yield family
    lag = GaugeMetricFamily("gpubook_scheduler_lag_seconds",
                            "Seconds since the last scheduler tick finished (alert when it grows).")
    if last_at is not None:
        lag.add_metric([], max(0.0, now.timestamp() - last_at))
    yield lag
    conflicts = CounterMetricFamily("gpubook_booking_conflicts", "Bookings refused (overlap, quota, …) by code.",
                                    labels=["code"])
    seen = False
    for (name, labels), value in sorted(values.items()):
        if name == BOOKING_CONFLICTS:
            conflicts.add_metric([labels.removeprefix("code=")], value)
            seen = True
    if not seen:
        conflicts.add_metric(["slot_conflict"], 0.0)
    yield conflicts


def quota_families(*, now: dt.datetime):
    """This month's quota position per team (each team's month in its own time zone): booked
    GPU-seconds, backfill GPU-seconds at the usage factor (running ones up to now) — the one
    quota rule, reservations.selectors.quota_positions, read at scrape time."""
    from reservations import selectors  # like the app registry reads above: no import at load

    Team = apps.get_model("reservations", "Team")
    teams = list(Team.objects.order_by("slug"))
    positions = selectors.quota_positions(teams=teams, now=now)
    quota = GaugeMetricFamily("gpubook_team_quota_gpu_seconds", "Monthly quota (GPU-seconds).", labels=["team"])
    used = GaugeMetricFamily("gpubook_team_quota_used_gpu_seconds", "Quota used this month (GPU-seconds), booked "
                             "or by backfill at its usage factor.", labels=["team", "kind"])
    ratio = GaugeMetricFamily("gpubook_team_quota_used_ratio", "Share of this month's quota used (0–1, may exceed 1).",
                              labels=["team"])
    for team in teams:
        position = positions[team.pk]
        quota.add_metric([team.slug], position.quota_gpu_s)
        used.add_metric([team.slug, "reserved"], position.booked_gpu_s)
        used.add_metric([team.slug, "backfill"], position.backfill_gpu_s)
        if position.quota_gpu_s:
            ratio.add_metric([team.slug], position.used_gpu_s / position.quota_gpu_s)
    yield quota
    yield used
    yield ratio


def deployment_families():
    """Configuration the alert rules compare against (deploy/prometheus/alerts.yaml)."""
    interval = GaugeMetricFamily(
        "gpubook_scheduler_tick_interval_seconds", "The configured scheduler tick interval (GPUBOOK_TICK_SECONDS)."
    )
    interval.add_metric([], float(settings.GPUBOOK_TICK_SECONDS))
    yield interval


def notification_families():
    """Notification deliveries by channel and state: `failed` ones gave up after their retries
    (deploy/prometheus/alerts.yaml alerts on them), `pending` ones wait for a retry."""
    Delivery = apps.get_model("notifications", "Delivery")
    family = GaugeMetricFamily(
        "gpubook_notification_deliveries", "Notification deliveries by channel and state.", labels=["channel", "state"]
    )
    counts = {
        (row["channel"], row["state"]): row["n"]
        for row in Delivery.objects.values("channel", "state").annotate(n=Count("id")).order_by()
    }
    for channel in Delivery.Channel.values:
        for state in Delivery.State.values:
            family.add_metric([channel, state], float(counts.get((channel, state), 0)))
    yield family
