"""A pytest plugin (`-p tests.deploy.k8s_request_log`) that appends every request the fake
Kubernetes API server receives, with the test that caused it, to the JSON-lines file named by
GPUBOOK_K8S_REQUEST_LOG. tests/deploy/test_kubernetes.py runs the executor's tests with it."""

import json
import os
import threading

import pytest

_current = {"test": ""}
_lock = threading.Lock()


def pytest_configure(config):
    from tests.fakes.k8s_api import REQUEST_LISTENERS

    path = os.environ["GPUBOOK_K8S_REQUEST_LOG"]

    def record(method: str, request_path: str, query: dict) -> None:
        line = json.dumps({"test": _current["test"], "method": method, "path": request_path, "query": query})
        with _lock, open(path, "a") as log:
            log.write(line + "\n")

    REQUEST_LISTENERS.append(record)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _current["test"] = item.nodeid
