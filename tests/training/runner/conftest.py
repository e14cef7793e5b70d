"""Fixtures for the runner tests (helpers in support.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.training.runner.support import ReportServer, make_network_audit, serve_reports


@pytest.fixture
def report_server() -> Iterator[ReportServer]:
    """A loopback HTTP server standing in for the web app's run-report endpoint."""
    with serve_reports() as server:
        yield server


@pytest.fixture
def network_audit(tmp_path: Path) -> Path:
    """PYTHONPATH entry whose sitecustomize records non-loopback DNS/connects."""
    return make_network_audit(tmp_path)
