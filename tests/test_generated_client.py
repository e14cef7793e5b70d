"""A Python client generated from the app's own OpenAPI schema (openapi-python-client, as an
API user would run it) books and cancels against a live server. The generated models keep any
field the schema did not declare in `additional_properties`; every answer here must have none,
and every status the server sends must be one the schema lists (raise_on_unexpected_status)."""

import datetime as dt
import importlib
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import attrs
import pytest

H = dt.timedelta(hours=1)
GENERATOR = Path(sys.executable).with_name("openapi-python-client")


@pytest.fixture
def api(live_server, tmp_path, monkeypatch):
    """The package `gpubook_api`, generated into tmp_path from the live server's schema."""
    with urllib.request.urlopen(f"{live_server.url}/api/schema/?format=json", timeout=30) as response:  # noqa: S310
        (tmp_path / "schema.json").write_bytes(response.read())
    # No formatting hooks: the generator would look for `ruff` on PATH; the code runs the same.
    (tmp_path / "config.json").write_text(json.dumps({"post_hooks": []}))
    subprocess.run(
        [str(GENERATOR), "generate", "--path", str(tmp_path / "schema.json"), "--config", str(tmp_path / "config.json"),
         "--meta", "none", "--output-path", str(tmp_path / "gpubook_api")],
        check=True, capture_output=True, text=True, timeout=120,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [name for name in sys.modules if name == "gpubook_api" or name.startswith("gpubook_api.")]:
        monkeypatch.delitem(sys.modules, name)
    return importlib.import_module("gpubook_api")


def load(module: str):
    return importlib.import_module(f"gpubook_api.{module}")


def exact(model) -> None:
    """The answer carried no field the schema leaves out, at any depth (a model whose schema
    forbids extra fields has no `additional_properties` at all)."""
    assert getattr(model, "additional_properties", {}) == {}, (type(model).__name__, model.additional_properties)
    for field in attrs.fields(type(model)):
        value = getattr(model, field.name)
        for item in value if isinstance(value, list) else [value]:
            if attrs.has(type(item)):
                exact(item)


@pytest.mark.django_db(transaction=True)
def test_a_generated_client_logs_in_books_and_cancels(api, live_server, people, inventory, future_day):
    anonymous = api.Client(base_url=live_server.url, raise_on_unexpected_status=True)
    CredentialsRequest = load("models.credentials_request").CredentialsRequest
    token = load("api.auth.auth_token_create").sync(client=anonymous, body=CredentialsRequest("alice", "pw-alice"))
    exact(token)
    client = api.AuthenticatedClient(base_url=live_server.url, token=token.token, prefix="Token",
                                     raise_on_unexpected_status=True)

    gpus = load("api.gpus.gpus_list").sync(client=client)
    exact(gpus)
    gpu = next(g for g in gpus.results if g.node == "node-a" and g.index == 0)
    teams = load("api.teams.teams_list").sync(client=client)
    exact(teams)
    vision = next(t for t in teams.results if t.slug == "vision")
    assert vision.usage.quota_gpu_hours == 100

    berlin = dt.timezone(dt.timedelta(hours=1))
    start = (future_day + 9 * H).astimezone(berlin)  # an offset other than UTC's goes through as such
    ReservationCreateRequest = load("models.reservation_create_request").ReservationCreateRequest
    body = ReservationCreateRequest(gpus=[gpu.id], team=vision.id, start=start, end=start + 2 * H,
                                    note="from a generated client")
    create = load("api.reservations.reservations_create")
    booked = create.sync(client=client, body=body)
    Reservation = load("models.reservation").Reservation
    assert isinstance(booked, Reservation), booked
    exact(booked)
    assert booked.start == start and booked.end == start + 2 * H and booked.gpus == [gpu.id]
    assert booked.status == load("models.reservation_status_enum").ReservationStatusEnum.CONFIRMED

    conflict = create.sync_detailed(client=client, body=body)
    assert conflict.status_code == 409
    exact(conflict.parsed)
    assert conflict.parsed.code == "slot_conflict" and conflict.parsed.detail

    cancelled = load("api.reservations.reservations_cancel_create").sync(id=booked.id, client=client)
    exact(cancelled)
    assert cancelled.id == booked.id and cancelled.status.value == "cancelled"

    listing = load("api.reservations.reservations_list")
    status = load("models.reservations_list_status").ReservationsListStatus
    mine = listing.sync(client=client, mine=True, status=status.CANCELLED)
    exact(mine)
    assert [r.id for r in mine.results] == [booked.id]

    missing = load("api.reservations.reservations_retrieve").sync_detailed(id=booked.id + 1000, client=client)
    assert missing.status_code == 404 and missing.parsed.code == "not_found"
