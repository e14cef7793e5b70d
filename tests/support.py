"""What tests share: the personas, booking through the real service, and signed-in clients.

Personas (healthchecks' habit): in team `vision` the owner (alice), a teammate (dave) and a
manager (bob); in team `nlp` the outsider (carol); and an admin. Every endpoint is tested
with the outsider too. `tests/conftest.py` offers them as the `people` and `inventory`
fixtures; rows written straight to the database live in tests/factories.py.
"""

import datetime as dt
import time

from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone


def make_people() -> dict:
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


def make_inventory() -> dict:
    from gpus.models import Gpu, Node

    node_a = Node.objects.create(name="node-a")
    node_b = Node.objects.create(name="node-b")
    gpus_a = [Gpu.objects.create(node=node_a, index=i, model_name="NVIDIA A100", memory_mib=81920) for i in range(4)]
    gpus_b = [Gpu.objects.create(node=node_b, index=i, model_name="NVIDIA L40S", memory_mib=46068) for i in range(2)]
    return {"node_a": node_a, "node_b": node_b, "a": gpus_a, "b": gpus_b}


def book(user, team, gpus, start: dt.datetime, end: dt.datetime | None = None, *, hours: float = 2,
         now: dt.datetime | None = None, note: str = ""):
    """Book `gpus` for `user` in `team` through reservations.services.reservation_create:
    [start, end), or `hours` from start; `now` defaults to the real clock."""
    from reservations.services import reservation_create

    return reservation_create(
        user=user, team=team, gpu_ids=[gpu.pk for gpu in gpus], start=start,
        end=end if end is not None else start + dt.timedelta(hours=hours),
        now=now if now is not None else timezone.now(), note=note,
    )


def client_for(user, *, api: bool = False, **kwargs):
    """A client signed in as `user`: the browser's (a session) or, with `api=True`, the
    API's (a token; `user=None` gives an anonymous API client)."""
    if not api:
        client = Client(**kwargs)
        client.force_login(user)
        return client
    from rest_framework.test import APIClient

    from tests.security.tokens import token_for

    client = APIClient(**kwargs)
    if user is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Token {token_for(user)}")
    return client


def wait_for(predicate, what: str = "condition", *, timeout: float = 120.0):
    """Poll `predicate` until it returns something truthy and return that; fail after
    `timeout` seconds naming `what`. For waits on other processes (runners, a fake kubelet),
    never a fixed sleep."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
