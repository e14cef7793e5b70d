"""Fixtures for the executor tests: a spec factory, a poller, and the fake Kubernetes API.

The executors are Django-free, so these tests run with `-p no:django`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.fakes.k8s_api import FakeKubernetes
from training.executors.base import RunSpec

NOW = datetime(2026, 5, 4, 9, 0, tzinfo=UTC)
IMAGE = "registry.example.com/training/yolo:v8n-cu118"


def make_spec(**overrides: Any) -> RunSpec:
    fields: dict[str, Any] = {
        "run_id": 42,
        "image": IMAGE,
        "argv": ["python", "-m", "training.runner", "--spec", "/runs/vision/7/spec.json"],
        "node_name": "gpu-node-3",
        "gpu_indices": (0, 1),
        "team": "vision",
        "job_id": 7,
        "reservation_id": 11,
        "must_end_by": NOW + timedelta(hours=2),
        "grace_s": 120,
    }
    fields.update(overrides)
    return RunSpec(**fields)


def wait_until(predicate: Callable[[], Any], timeout: float = 15.0, interval: float = 0.02) -> Any:
    """Poll until `predicate()` is truthy; fail with a clear message at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {predicate}")
        time.sleep(interval)


@pytest.fixture
def fake_k8s() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as fake:
        yield fake
