"""Shared fixtures: the personas (owner, teammate, manager, outsider, admin) and a small
inventory. Every test that books passes `now` explicitly or books well in the future."""

import datetime as dt
import os

import pytest
from django.db import connection

UTC = dt.UTC


def pytest_collection_modifyitems(config, items):
    # CI must never quietly skip the PostgreSQL tests because the database is SQLite.
    if os.environ.get("CI") == "true" and os.environ.get("GPUBOOK_REQUIRE_POSTGRES") == "1":
        from django.conf import settings

        engine = settings.DATABASES["default"]["ENGINE"]
        if "postgresql" not in engine:
            raise pytest.UsageError("CI run expected PostgreSQL but DATABASE_URL is not PostgreSQL")


@pytest.fixture
def postgres_only():
    if connection.vendor != "postgresql":
        pytest.fail("this test needs PostgreSQL: run it with DATABASE_URL=postgres://…")


@pytest.fixture
def inventory(db):
    from tests.support import make_inventory

    return make_inventory()


@pytest.fixture
def people(db):
    """The personas (tests/support.py): owner, teammate and manager in `vision`, the
    outsider in `nlp`, and an admin. Also the trainer image catalog the migration seeds: a
    transactional (live-server) test that ran before flushed those rows away."""
    import importlib

    from django.apps import apps

    from tests.support import make_people

    importlib.import_module("training.migrations.0002_image_catalog").seed(apps, None)
    return make_people()


@pytest.fixture
def future_day():
    """Midnight UTC three days from the real clock: far enough that API calls (which use the
    real clock) treat it as bookable, near enough for the default 60-day horizon."""
    today = dt.datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return today + dt.timedelta(days=3)


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Log-in failure counts (config/login_guard.py) live in the cache: no test inherits them."""
    from django.core.cache import cache

    cache.clear()
    yield
