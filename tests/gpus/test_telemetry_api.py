"""Sample ingestion with per-node tokens, the list endpoint, retention, the embedded hook and
the Prometheus (DCGM) reader."""

import datetime as dt

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from gpus import prometheus_source
from gpus.models import GpuSample, NodeAgentToken
from gpus.telemetry import hooks, store
from gpus.telemetry.nvml import Reading
from tests.gpus.test_sampler import FakeSampler

URL = "/api/v1/telemetry/samples/"
GIB = 1024**3


def minute_ago(minutes=1):
    return timezone.now().replace(second=0, microsecond=0) - dt.timedelta(minutes=minutes)


def bucket(index=0, uuid="", minute=None, utilization=0.5, **extra):
    return {"minute": (minute or minute_ago()).isoformat(), "index": index, "uuid": uuid, "sample_count": 12,
            "utilization_mean": utilization, "utilization_max": min(1.0, utilization + 0.1),
            "memory_used_bytes_mean": 4 * GIB, "memory_used_bytes_max": 5 * GIB, "memory_total_bytes": 80 * GIB,
            "temperature_celsius_mean": 61.5, "temperature_celsius_max": 64.0,
            "power_watts_mean": 240.0, "power_watts_max": 300.0, **extra}


@pytest.fixture
def tokens(inventory):
    now = timezone.now()
    _, token_a = store.agent_token_issue(node=inventory["node_a"], now=now)
    _, token_b = store.agent_token_issue(node=inventory["node_b"], now=now)
    return {"a": token_a, "b": token_b}


def post(token, body):
    client = APIClient()
    return client.post(URL, body, format="json", HTTP_AUTHORIZATION=f"Bearer {token}")


def test_a_node_posts_buckets_with_its_token(inventory, tokens):
    inventory["a"][1].uuid = "GPU-one"
    inventory["a"][1].save()
    answer = post(tokens["a"], {"node": "node-a", "buckets": [bucket(0), bucket(7, uuid="GPU-one"), bucket(9)]})
    assert answer.status_code == 202, answer.json()
    assert answer.json() == {"stored": 2, "unknown_gpus": ["index 9"]}
    by_gpu = {row.gpu_id: row for row in GpuSample.objects.all()}
    assert set(by_gpu) == {inventory["a"][0].pk, inventory["a"][1].pk}  # the UUID wins over index 7
    row = by_gpu[inventory["a"][0].pk]
    assert row.utilization_mean == 0.5 and row.memory_used_bytes_max == 5 * GIB and row.sample_count == 12
    assert NodeAgentToken.objects.get(node=inventory["node_a"]).last_used_at is not None


def test_a_repeated_post_replaces_the_minute_instead_of_counting_it_twice(inventory, tokens):
    minute = minute_ago()
    post(tokens["a"], {"buckets": [bucket(0, minute=minute, utilization=0.2)]})
    post(tokens["a"], {"buckets": [bucket(0, minute=minute, utilization=0.3)]})
    (row,) = GpuSample.objects.all()
    assert row.utilization_mean == 0.3


@pytest.mark.parametrize("token", ["", "gpa_wrong", "Token abc"])
def test_a_wrong_node_token_is_refused(inventory, tokens, token):
    answer = APIClient().post(URL, {"buckets": [bucket()]}, format="json",
                              HTTP_AUTHORIZATION=token if token.startswith("Token") else f"Bearer {token}")
    assert answer.status_code == 401
    assert answer.json()["code"] == "invalid_node_token"
    assert not GpuSample.objects.exists()


def test_a_revoked_token_is_refused(inventory, tokens):
    NodeAgentToken.objects.filter(node=inventory["node_a"]).update(revoked=True)
    assert post(tokens["a"], {"buckets": [bucket()]}).status_code == 401


def test_a_token_cannot_post_for_another_node(inventory, tokens):
    answer = post(tokens["b"], {"node": "node-a", "buckets": [bucket()]})
    assert answer.status_code == 403 and answer.json()["code"] == "wrong_node"
    assert not GpuSample.objects.exists()


@pytest.mark.parametrize(
    "change",
    [{"utilization_mean": 1.5}, {"minute": "2025-01-01T10:00:30+00:00"}, {"minute": "2025-01-01T10:00:00"},
     {"temperature_celsius_mean": "hot"}, {"index": -1}, {"power_watts_mean": -3.0}],
)
def test_bad_buckets_are_refused_whole(inventory, tokens, change):
    answer = post(tokens["a"], {"buckets": [bucket(1), {**bucket(0), **change}]})
    assert answer.status_code == 400 and answer.json()["code"] == "invalid_samples"
    assert not GpuSample.objects.exists()


def test_people_read_samples_back(inventory, tokens, people):
    post(tokens["a"], {"buckets": [bucket(0), bucket(1)]})
    assert APIClient().get(URL).status_code in (401, 403)
    client = APIClient()
    client.force_authenticate(people["outsider"])
    answer = client.get(URL, {"node": "node-a", "gpu": inventory["a"][1].pk})
    assert answer.status_code == 200
    (item,) = answer.json()["results"]
    assert item["node"] == "node-a" and item["index"] == 1 and item["utilization_mean"] == 0.5


def test_old_buckets_are_pruned_after_the_retention(inventory, settings):
    settings.GPUBOOK_TELEMETRY_RETENTION_DAYS = 7
    now = dt.datetime(2025, 3, 10, 12, 0, tzinfo=dt.UTC)
    for days in (8, 6):
        GpuSample.objects.create(gpu=inventory["a"][0], minute=now - dt.timedelta(days=days), sample_count=1)
    assert store.samples_prune(now=now) == 1
    assert GpuSample.objects.get().minute == now - dt.timedelta(days=6)


def test_the_embedded_hook_samples_this_host_into_minute_buckets(inventory, settings):
    settings.GPUBOOK_NODE_NAME = "node-b"
    settings.PROMETHEUS_URL = ""
    hooks.reset_state()
    sampler = FakeSampler([Reading(index=1, uuid="", utilization=0.25, temperature_celsius=50.0)])
    t0 = dt.datetime(2025, 3, 10, 12, 0, tzinfo=dt.UTC)
    try:
        assert hooks.telemetry_tick(t0 + dt.timedelta(seconds=10), sampler=sampler)["stored"] == 0
        hooks.telemetry_tick(t0 + dt.timedelta(seconds=40), sampler=sampler)
        done = hooks.telemetry_tick(t0 + dt.timedelta(seconds=62), sampler=sampler)
    finally:
        hooks.reset_state()
    assert done["stored"] == 1
    (row,) = GpuSample.objects.all()
    assert row.gpu == inventory["b"][1] and row.minute == t0 and row.sample_count == 2
    assert row.utilization_mean == 0.25 and row.power_watts_mean is None


def test_prometheus_dcgm_figures_become_minute_buckets(inventory, settings, monkeypatch):
    settings.GPUBOOK_PROMETHEUS_NODE_LABEL = "Hostname"
    minute = dt.datetime(2025, 3, 10, 12, 0, tzinfo=dt.UTC)
    values = {
        "DCGM_FI_DEV_GPU_UTIL": 80.0, "DCGM_FI_DEV_FB_USED": 1024.0, "DCGM_FI_DEV_FB_FREE": 3072.0,
        "DCGM_FI_DEV_GPU_TEMP": 70.0, "DCGM_FI_DEV_POWER_USAGE": 300.0,
    }
    asked = []

    def fetch_json(url, params):
        asked.append(params)
        assert params["time"] == f"{(minute + dt.timedelta(minutes=1)).timestamp():.3f}"
        query = params["query"]
        if query.startswith("count_over_time"):
            value = 4.0
        else:
            value = sum(number for name, number in values.items() if name in query)
        result = [
            {"metric": {"Hostname": "node-a", "gpu": "2", "UUID": ""}, "value": [0, str(value)]},
            {"metric": {"Hostname": "elsewhere", "gpu": "0", "UUID": "GPU-x"}, "value": [0, str(value)]},
        ]
        return {"status": "success", "data": {"resultType": "vector", "result": result}}

    monkeypatch.setattr(prometheus_source, "fetch_json", fetch_json)
    assert prometheus_source.import_minute(url="http://prometheus:9090", minute=minute, now=minute) == 1
    row = GpuSample.objects.get()
    assert row.gpu == inventory["a"][2] and row.minute == minute and row.sample_count == 4
    assert row.utilization_mean == pytest.approx(0.8) and row.temperature_celsius_max == 70.0
    assert row.memory_used_bytes_mean == 1024 * 1024 * 1024 and row.memory_total_bytes == 4 * 1024**3
    assert row.power_watts_mean == 300.0
    assert len(asked) == len(prometheus_source.QUERIES)


def test_prometheus_errors_are_reported_not_swallowed(monkeypatch, db):
    monkeypatch.setattr(prometheus_source, "fetch_json", lambda url, params: {"status": "error", "error": "bad"})
    with pytest.raises(prometheus_source.PrometheusError, match="bad"):
        prometheus_source.import_minute(url="http://p", minute=minute_ago(), now=timezone.now())
