"""Telemetry in the embedded default (`make run`): the scheduler loop calls `telemetry_tick(now)`
after each reconcile. It samples this host's GPUs through NVML (or, with PROMETHEUS_URL set,
imports DCGM figures from Prometheus once a minute) and writes closed minute buckets straight
to the database, then prunes old buckets once an hour.

Settings: GPUBOOK_TELEMETRY_LOCAL (default True: sample this host), GPUBOOK_NODE_NAME (this
host's node name, default the host name), PROMETHEUS_URL, GPUBOOK_TELEMETRY_RETENTION_DAYS.
"""

import dataclasses
import datetime as dt
import logging
import socket

from django.conf import settings

from gpus.models import Node
from gpus.telemetry import store
from gpus.telemetry.buckets import MinuteAggregator, floor_minute
from gpus.telemetry.nvml import NvmlSampler

logger = logging.getLogger(__name__)
PRUNE_EVERY = dt.timedelta(hours=1)


@dataclasses.dataclass
class _LocalState:
    sampler: NvmlSampler | None = None
    aggregator: MinuteAggregator = dataclasses.field(default_factory=MinuteAggregator)
    last_prune: dt.datetime | None = None
    last_import_minute: dt.datetime | None = None
    said_no_node: bool = False


_state = _LocalState()


def reset_state() -> None:
    """Forget sampler and aggregator (tests)."""
    global _state
    if _state.sampler is not None:
        _state.sampler.close()
    _state = _LocalState()


def local_node_name() -> str:
    return settings.GPUBOOK_NODE_NAME or socket.gethostname()


def telemetry_tick(now: dt.datetime, *, sampler: NvmlSampler | None = None) -> dict:
    """One iteration; returns what it did (for logs and tests)."""
    done = {"sampled": 0, "stored": 0, "imported": 0, "pruned": 0}
    prometheus_url = settings.PROMETHEUS_URL
    if prometheus_url:
        minute = floor_minute(now) - dt.timedelta(minutes=1)  # the last minute that has ended
        if _state.last_import_minute != minute:
            from gpus import prometheus_source

            try:
                done["imported"] = prometheus_source.import_minute(url=prometheus_url, minute=minute, now=now)
                _state.last_import_minute = minute
            except prometheus_source.PrometheusError as error:
                logger.warning("telemetry from Prometheus failed: %s", error)
    elif settings.GPUBOOK_TELEMETRY_LOCAL:
        if sampler is not None:
            _state.sampler = sampler
        elif _state.sampler is None:
            _state.sampler = NvmlSampler()
        readings = _state.sampler.sample()
        done["sampled"] = len(readings)
        _state.aggregator.add(readings, at=now)
        closed = _state.aggregator.drain(now=now)
        if closed:
            done["stored"] = _store_local(closed, now=now)
    if _state.last_prune is None or now - _state.last_prune >= PRUNE_EVERY:
        done["pruned"] = store.samples_prune(now=now)
        _state.last_prune = now
    return done


def _store_local(buckets: list[dict], *, now: dt.datetime) -> int:
    node = Node.objects.filter(name=local_node_name()).first()
    if node is None:
        if not _state.said_no_node:
            logger.warning("telemetry: no node named %r; run `manage.py discover_gpus` (or set GPUBOOK_NODE_NAME)",
                           local_node_name())
            _state.said_no_node = True
        return 0
    parsed = [store.parse_bucket(bucket) for bucket in buckets]
    return store.samples_record(node=node, buckets=parsed, now=now).stored
