"""What one booking through the API costs in SQL (issue #19 item 1): a fixed budget on
PostgreSQL, and a count that does not grow with the bookings, webhooks and teammates there
already. Timing lives in benchmarks/booking.py; these count statements, which do not swing."""

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from notifications.models import Delivery, Webhook
from reservations.models import AuditEntry, Reservation
from tests.support import book, client_for

H = dt.timedelta(hours=1)
BUDGET = 12  # token, team, GPUs + role, BEGIN, locks + team row, checks + addressees, 5 writes, COMMIT


def post_booking(client, gpu, team, start):
    return client.post(
        "/api/v1/reservations/",
        {"gpus": [gpu.pk], "team": team.pk, "start": start.isoformat(), "end": (start + H).isoformat()},
        format="json",
    )


def statements_of_one_booking(client, gpu, team, start) -> tuple[int, dict]:
    with CaptureQueriesContext(connection) as captured:
        response = post_booking(client, gpu, team, start)
    assert response.status_code == 201, response.content
    return len(captured.captured_queries), response.json()


@pytest.fixture
def booker(people, inventory):
    people["owner"].email = "alice@lab.example"
    people["owner"].save()
    client = client_for(people["owner"], api=True)
    # The first request stamps the token's last use (once a minute): not part of a booking.
    assert client.get("/api/v1/teams/").status_code == 200
    return client


@pytest.mark.postgres
@pytest.mark.django_db
def test_one_booking_through_the_api_stays_within_its_budget(postgres_only, booker, people, inventory, future_day):
    count, body = statements_of_one_booking(booker, inventory["a"][0], people["vision"], future_day + 9 * H)
    assert count <= BUDGET
    # ...and is the whole booking: the row, its GPU, the audit entry, the notice and its email.
    reservation = Reservation.objects.get(pk=body["id"])
    assert list(reservation.booked.values_list("gpu_id", flat=True)) == [inventory["a"][0].pk]
    assert AuditEntry.objects.filter(reservation=reservation, action="create").count() == 1
    assert Delivery.objects.filter(target="alice@lab.example", notice__event_type="reservation.confirmed").count() == 1


@pytest.mark.django_db
def test_the_count_does_not_grow_with_the_bookings_and_webhooks_already_there(booker, people, inventory, future_day):
    small, _ = statements_of_one_booking(booker, inventory["a"][0], people["vision"], future_day + 9 * H)
    for hour in range(10, 22):
        book(people["teammate"], people["vision"], inventory["a"][1:3], future_day + hour * H, hours=1)
    for number in range(3):
        Webhook.objects.create(team=people["vision"], url=f"https://hooks.example/{number}")
    large, _ = statements_of_one_booking(booker, inventory["a"][0], people["vision"], future_day + 10 * H)
    assert large == small
    assert Delivery.objects.filter(channel=Delivery.Channel.WEBHOOK).count() == 3  # the second booking's, each hook


@pytest.mark.django_db
def test_the_answer_to_a_booking_is_what_reading_it_back_gives(booker, people, inventory, future_day):
    _, created = statements_of_one_booking(booker, inventory["a"][0], people["vision"], future_day + 9 * H)
    assert booker.get(f"/api/v1/reservations/{created['id']}/").json() == created
