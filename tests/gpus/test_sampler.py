"""The NVML sampler, the minute aggregator and the agent loop, against a fake NVML."""

import datetime as dt
import logging
import urllib.error

import pynvml
import pytest

from gpus.telemetry.agent import Agent
from gpus.telemetry.buckets import MinuteAggregator
from gpus.telemetry.nvml import NvmlSampler, Reading
from tests.gpus.fake_nvml import FakeGpu, FakeNvml

GIB = 1024**3
T0 = dt.datetime(2025, 3, 3, 10, 0, tzinfo=dt.UTC)
S = dt.timedelta(seconds=1)


@pytest.fixture
def nvml(monkeypatch):
    return FakeNvml([FakeGpu("GPU-aaa"), FakeGpu("GPU-bbb", utilization_percent=0, temperature=41)]).install(
        monkeypatch
    )


def test_reads_every_figure_in_base_units(nvml):
    sampler = NvmlSampler()
    first, second = sampler.sample()
    assert first == Reading(index=0, uuid="GPU-aaa", utilization=0.5, memory_used_bytes=8 * GIB,
                            memory_total_bytes=80 * GIB, temperature_celsius=60.0, power_watts=250.0)
    assert second.utilization == 0.0 and second.temperature_celsius == 41.0
    sampler.sample()
    assert nvml.init_calls == 1  # NVML stays open between samples
    sampler.close()
    assert nvml.shutdown_calls == 1


def test_a_figure_the_gpu_cannot_read_is_none_not_zero(nvml):
    nvml.gpus[0].failures = {"power": pynvml.NVML_ERROR_NOT_SUPPORTED, "temperature": pynvml.NVML_ERROR_UNKNOWN}
    first, second = NvmlSampler().sample()
    assert first.power_watts is None and first.temperature_celsius is None
    assert first.utilization == 0.5 and first.memory_used_bytes == 8 * GIB
    assert second.power_watts == 250.0


def test_a_gpu_lost_mid_sample_is_skipped_and_the_others_are_read(nvml):
    nvml.gpus.append(FakeGpu("GPU-ccc"))
    nvml.gpus[1].failures = {"handle": pynvml.NVML_ERROR_GPU_IS_LOST}
    readings = NvmlSampler().sample()
    assert [reading.uuid for reading in readings] == ["GPU-aaa", "GPU-ccc"]
    assert [reading.index for reading in readings] == [0, 2]


def test_nvml_failing_as_a_whole_reports_nothing_and_reopens(nvml):
    sampler = NvmlSampler()
    assert len(sampler.sample()) == 2
    nvml.count_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    assert sampler.sample() == []
    assert nvml.shutdown_calls == 1
    nvml.count_error = None
    assert len(sampler.sample()) == 2
    assert nvml.init_calls == 2


def test_without_nvml_it_says_so_once_and_reports_nothing(nvml, caplog):
    nvml.init_error = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    sampler = NvmlSampler()
    with caplog.at_level(logging.WARNING, logger="gpus.telemetry.nvml"):
        assert [sampler.sample() for _ in range(3)] == [[], [], []]
    assert len([record for record in caplog.records if "NVML is not available" in record.getMessage()]) == 1
    assert not sampler.available and "not available" in sampler.unavailable_reason


def reading(uuid="GPU-aaa", utilization=0.5, temperature=60.0, power=None, memory=GIB):
    return Reading(index=0, uuid=uuid, utilization=utilization, memory_used_bytes=memory, memory_total_bytes=80 * GIB,
                   temperature_celsius=temperature, power_watts=power)


def test_minute_buckets_hold_means_and_maxima_and_leave_once_closed():
    aggregator = MinuteAggregator()
    aggregator.add([reading(utilization=0.2, temperature=50.0, memory=GIB)], at=T0 + 5 * S)
    aggregator.add([reading(utilization=0.6, temperature=70.0, memory=3 * GIB, power=100.0)], at=T0 + 35 * S)
    assert aggregator.drain(now=T0 + 59 * S) == []  # the minute is still open
    aggregator.add([reading(utilization=1.0)], at=T0 + 65 * S)
    (bucket,) = aggregator.drain(now=T0 + 65 * S)
    assert bucket["minute"] == T0.isoformat() and bucket["sample_count"] == 2
    assert bucket["utilization_mean"] == pytest.approx(0.4) and bucket["utilization_max"] == 0.6
    assert bucket["temperature_celsius_mean"] == 60.0 and bucket["temperature_celsius_max"] == 70.0
    assert bucket["memory_used_bytes_mean"] == 2 * GIB and bucket["memory_used_bytes_max"] == 3 * GIB
    assert bucket["power_watts_mean"] == 100.0  # one reading had it: the None is not a zero
    assert len(aggregator) == 1  # the next minute stays until it closes


class FakeSampler:
    def __init__(self, readings):
        self.readings = readings

    def sample(self):
        return list(self.readings)

    def close(self):
        pass


def test_agent_posts_closed_minutes_and_keeps_them_while_the_server_is_down():
    posts, failures = [], []

    def post(url, token, body):
        if failures:
            raise failures.pop()
        posts.append(body)
        return {"stored": len(body["buckets"]), "unknown_gpus": []}

    agent = Agent(url="http://gpubook.test/api/v1/telemetry/samples/", token="gpa_x", node_name="node-a",
                  sampler=FakeSampler([reading()]), post=post)
    assert agent.run_once(T0 + 10 * S).posted == 0  # nothing closed yet
    failures.append(urllib.error.URLError("connection refused"))
    tick = agent.run_once(T0 + 70 * S)
    assert tick.error and tick.pending == 1 and posts == []
    tick = agent.run_once(T0 + 130 * S)
    assert tick.posted == 2 and tick.pending == 0
    assert [bucket["minute"] for bucket in posts[0]["buckets"]] == [T0.isoformat(), (T0 + 60 * S).isoformat()]
    assert posts[0]["node"] == "node-a"


def test_agent_drops_what_the_server_refuses_for_good():
    def post(url, token, body):
        raise urllib.error.HTTPError(url, 401, "Unauthorized", {}, None)

    agent = Agent(url="https://gpubook.test/x", token="wrong", node_name="n", sampler=FakeSampler([reading()]),
                  post=post)
    agent.run_once(T0)
    assert agent.run_once(T0 + 61 * S).pending == 0


def test_agent_refuses_a_non_http_url():
    with pytest.raises(ValueError, match="http"):
        Agent(url="file:///etc/passwd", token="t", node_name="n", sampler=FakeSampler([]))
