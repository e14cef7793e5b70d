"""Telemetry writes: minute buckets, retention, and the nodes' agent tokens."""

import dataclasses
import datetime as dt
import hashlib
import math
import secrets
from collections.abc import Iterable, Mapping

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q, Sum
from django.db.models.functions import TruncHour

from gpus.models import IDLE_GRID_PERCENTS, Gpu, GpuHourSummary, GpuSample, Node, NodeAgentToken

BUCKET_FIELDS = (
    "sample_count",
    "utilization_mean",
    "utilization_max",
    "memory_used_bytes_mean",
    "memory_used_bytes_max",
    "memory_total_bytes",
    "temperature_celsius_mean",
    "temperature_celsius_max",
    "power_watts_mean",
    "power_watts_max",
)
_INTEGER_FIELDS = {"sample_count", "memory_used_bytes_mean", "memory_used_bytes_max", "memory_total_bytes"}
_RATIO_FIELDS = {"utilization_mean", "utilization_max"}


class BadBucket(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class StoreResult:
    stored: int
    unknown_gpus: tuple[str, ...] = ()


def hash_agent_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def agent_token_issue(*, node: Node, now: dt.datetime, description: str = "") -> tuple[NodeAgentToken, str]:
    """A new token for `node`'s agent. The plain token is returned once and never stored."""
    token = "gpa_" + secrets.token_urlsafe(32)
    row = NodeAgentToken.objects.create(
        node=node, token_hash=hash_agent_token(token), description=description, created_at=now
    )
    return row, token


def agent_token_node(*, token: str, now: dt.datetime) -> Node | None:
    """The node a (non-revoked) token belongs to, or None."""
    if not token:
        return None
    row = (
        NodeAgentToken.objects.select_related("node")
        .filter(token_hash=hash_agent_token(token), revoked=False)
        .first()
    )
    if row is None:
        return None
    if row.last_used_at is None or now - row.last_used_at > dt.timedelta(minutes=1):
        NodeAgentToken.objects.filter(pk=row.pk).update(last_used_at=now)
    return row.node


def _clean_number(name: str, value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadBucket(f"`{name}` must be a finite number or null")
    if value < 0:
        raise BadBucket(f"`{name}` must not be negative")
    if name in _RATIO_FIELDS and value > 1:
        raise BadBucket(f"`{name}` is a ratio between 0 and 1")
    # Past the column's range PostgreSQL refuses the row (a 500); refuse the bucket instead.
    limit = 2**31 - 1 if name == "sample_count" else 2**63 - 1
    if name in _INTEGER_FIELDS and value > limit:
        raise BadBucket(f"`{name}` must be at most {limit}")
    return int(value) if name in _INTEGER_FIELDS else float(value)


def parse_bucket(raw: Mapping) -> dict:
    """Validate one bucket as the agent sends it (see buckets.MinuteAggregator)."""
    if not isinstance(raw, Mapping):
        raise BadBucket("each bucket must be an object")
    try:
        minute = dt.datetime.fromisoformat(str(raw["minute"]))
    except (KeyError, ValueError) as error:
        raise BadBucket("`minute` must be an ISO 8601 time with a UTC offset") from error
    if minute.tzinfo is None:
        raise BadBucket("`minute` needs a UTC offset")
    minute = minute.astimezone(dt.UTC)
    if minute.second or minute.microsecond:
        raise BadBucket("`minute` must be the start of a minute")
    index = raw.get("index")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise BadBucket("`index` must be a non-negative integer")
    clean = {"minute": minute, "index": index, "uuid": str(raw.get("uuid") or "")[:64]}
    for name in BUCKET_FIELDS:
        clean[name] = _clean_number(name, raw.get(name))
    clean["sample_count"] = clean["sample_count"] or 0
    return clean


def samples_record(*, node: Node, buckets: Iterable[dict], now: dt.datetime) -> StoreResult:
    """Store parsed minute buckets of `node`'s GPUs. A bucket for a (GPU, minute) that is
    already stored replaces it: an agent that retries a post it thinks failed must not count
    a minute twice. GPUs are matched by UUID, else by index; unknown ones are reported back
    (register them with `manage.py discover_gpus`)."""
    gpus = list(Gpu.objects.filter(node=node))
    by_uuid = {gpu.uuid: gpu for gpu in gpus if gpu.uuid}
    by_index = {gpu.index: gpu for gpu in gpus}
    rows, unknown = {}, []
    horizon = now + dt.timedelta(minutes=5)  # a host clock a little ahead is fine; a year is not
    for bucket in buckets:
        gpu = by_uuid.get(bucket["uuid"]) if bucket["uuid"] else None
        if gpu is None:
            gpu = by_index.get(bucket["index"])
            if gpu is not None and bucket["uuid"] and gpu.uuid and gpu.uuid != bucket["uuid"]:
                gpu = None  # index taken by another physical GPU: never file figures under the wrong one
        if gpu is None:
            unknown.append(bucket["uuid"] or f"index {bucket['index']}")
            continue
        if bucket["minute"] > horizon:
            raise BadBucket(f"bucket {bucket['minute'].isoformat()} is in the future")
        rows[(gpu.pk, bucket["minute"])] = GpuSample(
            gpu=gpu, minute=bucket["minute"], **{name: bucket[name] for name in BUCKET_FIELDS}
        )
    with transaction.atomic():
        # One post per node at a time: the roll-up of an hour is recomputed from its buckets,
        # and two posts in flight would each miss the other's minutes and the later would win.
        list(Node.objects.select_for_update(no_key=True).filter(pk=node.pk).values_list("pk"))
        GpuSample.objects.bulk_create(
            list(rows.values()),
            update_conflicts=True,
            unique_fields=["gpu", "minute"],
            update_fields=list(BUCKET_FIELDS),
        )
        if rows:
            minutes = [minute for _, minute in rows]
            hour_summaries_refresh(gpu_ids={gpu_id for gpu_id, _ in rows}, start=min(minutes),
                                   end=max(minutes) + dt.timedelta(minutes=1))
    return StoreResult(stored=len(rows), unknown_gpus=tuple(sorted(set(unknown))))


def hour_summaries_refresh(
    *, gpu_ids: Iterable[int] | None = None, start: dt.datetime | None = None, end: dt.datetime | None = None
) -> int:
    """Recompute the hourly roll-up (GpuHourSummary) of every hour that meets [start, end)
    for `gpu_ids` (None: all GPUs, all time) from the minute buckets: one aggregate query and
    one upsert, reading at most 60 buckets per GPU-hour. Idempotent; returns the hours written."""
    return summaries_rebuild(GpuSample, GpuHourSummary, gpu_ids=gpu_ids, start=start, end=end)


def _floor_hour(moment: dt.datetime) -> dt.datetime:
    return moment.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)


def summaries_rebuild(sample_model, summary_model, *, gpu_ids=None, start=None, end=None) -> int:
    """hour_summaries_refresh on the given model classes: the migration that adds the roll-up
    runs it on its historical models to roll up the buckets already stored."""
    buckets = sample_model.objects.all()
    if gpu_ids is not None:
        buckets = buckets.filter(gpu_id__in=list(gpu_ids))
    if start is not None:
        buckets = buckets.filter(minute__gte=_floor_hour(start))
    if end is not None:  # whole hours: the hour `end` falls in is recomputed to its end
        buckets = buckets.filter(minute__lt=_floor_hour(end - dt.timedelta(microseconds=1)) + dt.timedelta(hours=1))
    util = "utilization_mean"
    figures = (
        buckets.annotate(hour=TruncHour("minute", tzinfo=dt.UTC))
        .values("gpu_id", "hour")
        .annotate(samples=Count(util), sum_utilization=Sum(util),
                  **{f"under_{k}": Count(util, filter=Q(**{f"{util}__lt": k / 100})) for k in IDLE_GRID_PERCENTS})
        .order_by()
    )
    fields = ["samples", "sum_utilization", *(f"under_{k}" for k in IDLE_GRID_PERCENTS)]
    rows = [
        summary_model(gpu_id=item["gpu_id"], hour=item["hour"],
                      **{name: item[name] or 0 for name in fields})
        for item in figures
    ]
    summary_model.objects.bulk_create(rows, update_conflicts=True, unique_fields=["gpu", "hour"],
                                      update_fields=fields, batch_size=2000)
    return len(rows)


def retention_days() -> int:
    return settings.GPUBOOK_TELEMETRY_RETENTION_DAYS


def samples_prune(*, now: dt.datetime) -> int:
    """Delete minute buckets older than the retention setting; returns how many."""
    deleted, _ = GpuSample.objects.filter(minute__lt=now - dt.timedelta(days=retention_days())).delete()
    return deleted
