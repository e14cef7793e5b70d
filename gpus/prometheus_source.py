"""GPU telemetry from Prometheus (PROMETHEUS_URL) instead of agents: in Kubernetes clusters
where NVIDIA's DCGM exporter is already scraped, read the same figures from Prometheus' HTTP
API once a minute and store them as our minute buckets.

DCGM exporter series used (its default counters): DCGM_FI_DEV_GPU_UTIL (%), DCGM_FI_DEV_FB_USED
and DCGM_FI_DEV_FB_FREE (MiB), DCGM_FI_DEV_GPU_TEMP (°C), DCGM_FI_DEV_POWER_USAGE (W); labels
`gpu` (index), `UUID`, and the node in GPUBOOK_PROMETHEUS_NODE_LABEL (default `Hostname`; many
clusters relabel it to `node` or `kubernetes_node`).
"""

import datetime as dt
import json
import logging
import math
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict

from django.conf import settings

from gpus.models import Node
from gpus.telemetry import store

logger = logging.getLogger(__name__)
TIMEOUT_S = 10.0
MIB = 1024 * 1024
# our bucket field ← (PromQL over the minute, scale to base units)
QUERIES = {
    "utilization_mean": ("avg_over_time(DCGM_FI_DEV_GPU_UTIL[1m])", 0.01),
    "utilization_max": ("max_over_time(DCGM_FI_DEV_GPU_UTIL[1m])", 0.01),
    "memory_used_bytes_mean": ("avg_over_time(DCGM_FI_DEV_FB_USED[1m])", MIB),
    "memory_used_bytes_max": ("max_over_time(DCGM_FI_DEV_FB_USED[1m])", MIB),
    "memory_total_bytes": ("max_over_time(DCGM_FI_DEV_FB_USED[1m]) + max_over_time(DCGM_FI_DEV_FB_FREE[1m])", MIB),
    "temperature_celsius_mean": ("avg_over_time(DCGM_FI_DEV_GPU_TEMP[1m])", 1.0),
    "temperature_celsius_max": ("max_over_time(DCGM_FI_DEV_GPU_TEMP[1m])", 1.0),
    "power_watts_mean": ("avg_over_time(DCGM_FI_DEV_POWER_USAGE[1m])", 1.0),
    "power_watts_max": ("max_over_time(DCGM_FI_DEV_POWER_USAGE[1m])", 1.0),
    "sample_count": ("count_over_time(DCGM_FI_DEV_GPU_UTIL[1m])", 1.0),
}


class PrometheusError(RuntimeError):
    pass


def fetch_json(url: str, params: dict) -> dict:
    """GET Prometheus' API (the function boundary tests replace)."""
    if not url.lower().startswith(("http://", "https://")):
        raise PrometheusError(f"PROMETHEUS_URL must be http(s), not {url!r}")
    full = f"{url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(full, timeout=TIMEOUT_S) as response:  # noqa: S310 — scheme checked above
            return json.loads(response.read())
    except (OSError, ValueError) as error:
        raise PrometheusError(f"querying {url}: {error}") from error


def query_vector(*, url: str, promql: str, at: dt.datetime) -> list[tuple[dict, float]]:
    body = fetch_json(url, {"query": promql, "time": f"{at.timestamp():.3f}"})
    if body.get("status") != "success":
        raise PrometheusError(f"{promql}: {body.get('error') or body.get('status')}")
    data = body.get("data") or {}
    if data.get("resultType") != "vector":
        raise PrometheusError(f"{promql}: expected a vector, got {data.get('resultType')}")
    out = []
    for item in data.get("result") or []:
        try:
            value = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if math.isfinite(value):
            out.append((item.get("metric") or {}, value))
    return out


def import_minute(*, url: str, minute: dt.datetime, now: dt.datetime) -> int:
    """Read the minute [minute, minute+1m) for every GPU Prometheus knows and store it under
    the nodes we know. Returns the number of buckets stored."""
    node_label = settings.GPUBOOK_PROMETHEUS_NODE_LABEL
    at = minute + dt.timedelta(minutes=1)
    buckets: dict[tuple[str, str, int], dict] = defaultdict(dict)
    for field, (promql, scale) in QUERIES.items():
        for labels, value in query_vector(url=url, promql=promql, at=at):
            node = labels.get(node_label, "")
            try:
                index = int(labels.get("gpu", ""))
            except ValueError:
                continue
            if not node:
                continue
            buckets[(node, labels.get("UUID", ""), index)][field] = value * scale
    by_node: dict[str, list[dict]] = defaultdict(list)
    for (node, uuid, index), figures in buckets.items():
        raw = {"minute": minute.isoformat(), "index": index, "uuid": uuid, **figures}
        raw["sample_count"] = int(raw.get("sample_count") or 0)
        for name in ("utilization_mean", "utilization_max"):
            if raw.get(name) is not None:
                raw[name] = max(0.0, min(1.0, raw[name]))
        try:
            by_node[node].append(store.parse_bucket(raw))
        except store.BadBucket as error:
            logger.warning("Prometheus figures for %s GPU %s skipped: %s", node, index, error)
    stored = 0
    nodes = {node.name: node for node in Node.objects.filter(name__in=list(by_node))}
    for name, parsed in sorted(by_node.items()):
        if name not in nodes:
            logger.info("Prometheus reports GPUs of %r, which is not a gpubook node", name)
            continue
        stored += store.samples_record(node=nodes[name], buckets=parsed, now=now).stored
    return stored
