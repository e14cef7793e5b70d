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
    from gpus.models import Gpu, Node

    node_a = Node.objects.create(name="node-a")
    node_b = Node.objects.create(name="node-b")
    gpus_a = [
        Gpu.objects.create(node=node_a, index=i, model_name="NVIDIA A100", memory_mib=81920)
        for i in range(4)
    ]
    gpus_b = [
        Gpu.objects.create(node=node_b, index=i, model_name="NVIDIA L40S", memory_mib=46068)
        for i in range(2)
    ]
    return {"node_a": node_a, "node_b": node_b, "a": gpus_a, "b": gpus_b}


@pytest.fixture
def people(db):
    from django.contrib.auth import get_user_model

    from reservations.models import Membership, Team

    user_model = get_user_model()
    vision = Team.objects.create(name="vision", slug="vision", monthly_gpu_hours=100)
    nlp = Team.objects.create(name="nlp", slug="nlp", monthly_gpu_hours=100)

    def make(username, team=None, role=Membership.Role.MEMBER, **extra):
        user = user_model.objects.create_user(username=username, password="pw-" + username, **extra)
        if team is not None:
            Membership.objects.create(user=user, team=team, role=role)
        return user

    return {
        "vision": vision,
        "nlp": nlp,
        "owner": make("alice", vision),
        "teammate": make("dave", vision),
        "manager": make("bob", vision, Membership.Role.MANAGER),
        "outsider": make("carol", nlp),
        "admin": make("admin", is_superuser=True, is_staff=True),
    }


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
