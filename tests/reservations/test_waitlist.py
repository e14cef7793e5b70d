"""The waitlist, one sweep at a time: notify or auto-book when a taken slot frees, first come
first served, entries expiring at the slot's start."""

import datetime as dt

import pytest
from rest_framework.test import APIClient

from config.errors import DomainError
from notifications.models import EventType, Notice
from notifications.transports.email import render_email
from reservations.models import Reservation, WaitlistEntry
from reservations.services import reservation_cancel, reservation_create
from reservations.waitlist import waitlist_join, waitlist_run_once
from tests.security.tokens import token_for

NOW = dt.datetime(2027, 2, 1, 8, 0, tzinfo=dt.UTC)
H = dt.timedelta(hours=1)
SLOT = (NOW + 24 * H, NOW + 26 * H)


@pytest.fixture
def taken(people, inventory):
    for name in ("owner", "teammate", "manager"):
        people[name].email = f"{people[name].username}@example.org"
        people[name].save(update_fields=["email"])
    gpu = inventory["a"][0]
    booking = reservation_create(user=people["teammate"], team=people["vision"], gpu_ids=[gpu.pk],
                                 start=SLOT[0], end=SLOT[1], now=NOW)
    return {"booking": booking, "gpu": gpu}


def join(people, taken, who="owner", mode="notify"):
    return waitlist_join(user=people[who], team=people["vision"], gpu_ids=[taken["gpu"].pk], start=SLOT[0],
                         end=SLOT[1], mode=mode, now=NOW)


@pytest.mark.django_db
def test_a_free_slot_is_booked_not_waited_for(people, inventory, taken):
    with pytest.raises(DomainError) as free:
        waitlist_join(user=people["owner"], team=people["vision"], gpu_ids=[inventory["a"][1].pk], start=SLOT[0],
                      end=SLOT[1], mode="notify", now=NOW)
    assert free.value.code == "slot_free"
    with pytest.raises(DomainError) as not_member:
        join(people, taken, who="outsider")
    assert not_member.value.code == "unknown_team"


@pytest.mark.django_db
def test_notify_when_the_slot_frees(people, taken):
    entry = join(people, taken)
    assert waitlist_run_once(now=NOW) == {"expired": 0, "notified": 0, "booked": 0, "failed": 0}
    reservation_cancel(reservation_id=taken["booking"].pk, actor=people["teammate"], now=NOW)
    assert waitlist_run_once(now=NOW)["notified"] == 1
    entry.refresh_from_db()
    assert entry.state == WaitlistEntry.State.NOTIFIED
    notice = Notice.objects.get(event_type=EventType.WAITLIST_SLOT_FREE)
    assert {d.target for d in notice.deliveries.all()} == {"alice@example.org"}
    subject, text, _ = render_email(notice, people["owner"])
    assert "free" in subject.lower() and "node-a" in text
    assert waitlist_run_once(now=NOW)["notified"] == 0  # told once


@pytest.mark.django_db
def test_auto_book_first_come_first_served(people, taken):
    first = join(people, taken, who="owner", mode="book")
    second = join(people, taken, who="manager", mode="book")
    reservation_cancel(reservation_id=taken["booking"].pk, actor=people["teammate"], now=NOW)
    assert waitlist_run_once(now=NOW)["booked"] == 1
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.state == WaitlistEntry.State.BOOKED and first.reservation.user == people["owner"]
    assert first.reservation.status == Reservation.Status.CONFIRMED
    assert second.state == WaitlistEntry.State.WAITING  # the slot is taken again, by the first in line
    assert Notice.objects.filter(event_type=EventType.WAITLIST_BOOKED).count() == 1

    # Entries expire when the slot begins.
    assert waitlist_run_once(now=SLOT[0])["expired"] == 1
    second.refresh_from_db()
    assert second.state == WaitlistEntry.State.EXPIRED


@pytest.mark.django_db
def test_auto_book_under_the_same_rules(people, taken):
    entry = join(people, taken, mode="book")
    people["vision"].monthly_gpu_hours = 1  # the quota no longer allows 2 GPU-hours
    people["vision"].save(update_fields=["monthly_gpu_hours"])
    reservation_cancel(reservation_id=taken["booking"].pk, actor=people["teammate"], now=NOW)
    assert waitlist_run_once(now=NOW)["failed"] == 1
    entry.refresh_from_db()
    assert entry.state == WaitlistEntry.State.FAILED and "this booking needs 2.0" in entry.outcome
    assert not Reservation.objects.filter(user=people["owner"]).exists()


@pytest.mark.django_db
def test_waitlist_api(people, inventory):
    gpu = inventory["a"][2]
    start = (dt.datetime.now(dt.UTC) + dt.timedelta(days=2)).replace(minute=0, second=0, microsecond=0)
    reservation_create(user=people["teammate"], team=people["vision"], gpu_ids=[gpu.pk], start=start,
                       end=start + 2 * H, now=dt.datetime.now(dt.UTC))
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token_for(people['owner'])}")
    body = {"gpus": [gpu.pk], "team": people["vision"].pk, "start": start.isoformat(),
            "end": (start + 2 * H).isoformat(), "mode": "book"}
    joined = api.post("/api/v1/waitlist/", body, format="json")
    assert joined.status_code == 201 and joined.json()["state"] == "waiting"
    assert [e["id"] for e in api.get("/api/v1/waitlist/").json()["results"]] == [joined.json()["id"]]
    left = api.post(f"/api/v1/waitlist/{joined.json()['id']}/leave/", {}, format="json")
    assert left.json()["state"] == "cancelled"
    bad_mode = api.post("/api/v1/waitlist/", {**body, "mode": "maybe"}, format="json")
    assert bad_mode.status_code == 400
