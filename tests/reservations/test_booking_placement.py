"""`GET /api/v1/booking-placement/`: the GPUs to book for N, chosen around the live runs by
the rule the simulator's booking service follows (scheduler/booking_placement.py), on the
real database; and the answer booked as it is."""

import datetime as dt

import pytest
from django.utils import timezone

from gpus.models import MaintenanceWindow
from tests.factories import make_job, make_run
from tests.reservations.test_api import assert_error
from tests.support import book, client_for
from training.models import Run

URL = "/api/v1/booking-placement/"


def _slot(future_day):
    return future_day + dt.timedelta(hours=10), future_day + dt.timedelta(hours=12)


def _query(start, end, gpus):
    return {"gpus": gpus, "start": start.isoformat(), "end": end.isoformat()}


def _backfill(people, gpu, *, checkpointable: bool, history: bool):
    """A backfill run on `gpu` since an hour ago, expected to end in ten minutes; the
    expectation counts only if it came from the owner's history (`history`)."""
    now = timezone.now()
    job = make_job(user=people["teammate"], team=people["vision"], submitted_at=now - dt.timedelta(hours=2),
                   state="running")
    job.checkpointable = checkpointable
    job.predicted_duration_s = 4_200 if history else None
    job.save(update_fields=["checkpointable", "predicted_duration_s"])
    run = make_run(job=job, gpus=[gpu], started_at=now - dt.timedelta(hours=1), kind=Run.Kind.BACKFILL)
    run.estimated_end = now + dt.timedelta(minutes=10)
    run.save(update_fields=["estimated_end"])
    return run


@pytest.mark.django_db
def test_the_booking_goes_where_no_work_is_at_risk_and_books_as_given(people, inventory, future_day):
    # node-a: two of four GPUs already booked for the slot, so two free, as on node-b; node
    # order alone would pick node-a. Its GPU a0 holds a run that cannot checkpoint, trusted
    # (history) to end long before the slot: nothing lost if that holds, all of it if not.
    # node-b's b0 holds a checkpointable run: a wrong estimate there costs a restart.
    start, end = _slot(future_day)
    book(people["owner"], people["vision"], inventory["a"][2:], start, end)
    _backfill(people, inventory["a"][0], checkpointable=False, history=True)
    _backfill(people, inventory["b"][0], checkpointable=True, history=True)
    client = client_for(people["outsider"], api=True)

    answer = client.get(URL, _query(start, end, 2))

    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["node"] == inventory["node_b"].pk and body["node_name"] == "node-b"
    assert body["gpus"] == [gpu.pk for gpu in inventory["b"]]
    assert body["lost_gpu_s"] == 0 and body["restart_gpu_s"] == 0 and body["at_risk_gpu_s"] == 0
    booked = client.post(
        "/api/v1/reservations/",
        {"gpus": body["gpus"], "start": body["start"], "end": body["end"], "team": people["nlp"].pk},
        format="json",
    )
    assert booked.status_code == 201, booked.content


@pytest.mark.django_db
def test_certain_loss_outweighs_the_first_node(people, inventory, future_day):
    # node-a (first, and fullest once a2-a3 are booked) holds a run that cannot checkpoint and
    # has no history estimate on a0 and a1: booking there loses its hour for certain.
    start, end = _slot(future_day)
    book(people["owner"], people["vision"], inventory["a"][2:], start, end)
    for gpu in inventory["a"][:2]:
        _backfill(people, gpu, checkpointable=False, history=False)
    body = client_for(people["owner"], api=True).get(URL, _query(start, end, 1)).json()
    assert body["node"] == inventory["node_b"].pk
    assert body["lost_gpu_s"] == 0


@pytest.mark.django_db
def test_the_first_node_unless_a_run_there_must_restart(people, inventory, future_day):
    # Both nodes are free for the slot: node-a (four GPUs, first) is taken, not node-b, which
    # a booking of two would fill: bookings pile up on the first nodes and leave the last
    # ones free for days. A checkpointable run with no trusted end on a0 would be stopped and
    # restarted at the slot's start: node-b, where nothing must stop, is taken instead.
    start, end = _slot(future_day)
    client = client_for(people["owner"], api=True)
    body = client.get(URL, _query(start, end, 2)).json()
    assert body["node"] == inventory["node_a"].pk
    assert body["gpus"] == [gpu.pk for gpu in inventory["a"][:2]]
    for gpu in inventory["a"]:
        _backfill(people, gpu, checkpointable=True, history=False)
    body = client.get(URL, _query(start, end, 2)).json()
    assert body["node"] == inventory["node_b"].pk
    assert (body["lost_gpu_s"], body["restart_gpu_s"], body["at_risk_gpu_s"]) == (0, 0, 0)


@pytest.mark.django_db
def test_no_node_with_room_is_a_conflict(people, inventory, future_day):
    start, end = _slot(future_day)
    client = client_for(people["owner"], api=True)
    assert client.get(URL, _query(start, end, 4)).json()["node"] == inventory["node_a"].pk
    MaintenanceWindow.objects.create(node=inventory["node_a"], start=start - dt.timedelta(hours=1),
                                     end=start + dt.timedelta(minutes=30), reason="firmware")
    assert_error(client.get(URL, _query(start, end, 3)), 409, "no_room")
    assert client.get(URL, _query(start, end, 2)).json()["node"] == inventory["node_b"].pk


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"gpus": 0}, "invalid"),
        ({"gpus": "two"}, "invalid"),
        ({"gpus": 10**6}, "invalid"),
        ({"start": "2030-01-01T10:00:00"}, "naive_datetime"),
        ({"end": "yesterday"}, "invalid_datetime"),
        ({"swap": True}, "invalid_range"),
    ],
)
def test_bad_questions_get_a_clear_error(people, inventory, future_day, params, code):
    start, end = _slot(future_day)
    query = _query(end, start, 1) if params.pop("swap", False) else _query(start, end, 1)
    query.update(params)
    assert_error(client_for(people["owner"], api=True).get(URL, query), 400, code)


@pytest.mark.django_db
def test_anonymous_callers_are_refused(people, inventory, future_day):
    start, end = _slot(future_day)
    assert_error(client_for(None, api=True).get(URL, _query(start, end, 1)), 401, "not_authenticated")


@pytest.mark.django_db
def test_the_booking_form_books_a_count_where_no_work_is_at_risk(people, inventory, future_day):
    from reservations.models import Reservation

    start, end = _slot(future_day)
    book(people["owner"], people["vision"], inventory["a"][2:], start, end)
    _backfill(people, inventory["a"][0], checkpointable=False, history=True)
    client = client_for(people["owner"])
    form = {"team": people["vision"].pk, "date": start.date().isoformat(), "start_time": "10:00",
            "end_time": "12:00", "note": ""}
    assert 'name="count"' in client.get("/book/").content.decode()

    response = client.post("/book/", {**form, "count": 2})

    chosen = Reservation.objects.latest("pk")
    assert response.status_code == 302 and response["Location"] == f"/reservations/{chosen.pk}/"
    assert sorted(chosen.gpus.values_list("pk", flat=True)) == [gpu.pk for gpu in inventory["b"]]
    both = client.post("/book/", {**form, "count": 1, "gpus": [inventory["a"][1].pk]}).content.decode()
    assert "Tick GPUs or give a number, not both." in both
    full = client.post("/book/", {**form, "count": 3}).content.decode()
    assert "No node has 3 GPUs free for the whole slot." in full
    assert Reservation.objects.count() == 2
