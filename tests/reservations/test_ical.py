"""The per-user iCal feed: RFC 5545 via icalendar, UTC times, one event per booking, and a
secret URL that never shows anyone else's bookings."""

import datetime as dt

import icalendar
import pytest
from django.test import Client
from django.utils import timezone

from reservations import services
from reservations.models import UserProfile
from tests.support import book

UTC = dt.UTC


def token_of(user) -> str:
    profile, _ = UserProfile.objects.get_or_create(user=user)
    return profile.calendar_token


def fetch(token: str) -> icalendar.Calendar:
    response = Client().get(f"/ical/{token}.ics")  # no login: the token is the credential
    assert response.status_code == 200
    assert response["Content-Type"] == "text/calendar; charset=utf-8"
    return icalendar.Calendar.from_ical(response.content)


def events(calendar: icalendar.Calendar) -> list[icalendar.Event]:
    return list(calendar.walk("VEVENT"))


@pytest.fixture
def bookings(people, inventory, future_day):
    vision, nlp = people["vision"], people["nlp"]
    return {
        "mine_1": book(people["owner"], vision, inventory["a"][:2], future_day + dt.timedelta(hours=9), note="sweep"),
        "mine_2": book(people["owner"], vision, inventory["b"][:1], future_day + dt.timedelta(days=1, hours=22), hours=5),
        "teammate": book(people["teammate"], vision, inventory["a"][2:3], future_day + dt.timedelta(hours=9)),
        "outsider": book(people["outsider"], nlp, inventory["a"][3:4], future_day + dt.timedelta(hours=9)),
    }


def test_feed_parses_with_one_event_per_booking_in_utc(people, bookings):
    calendar = fetch(token_of(people["owner"]))
    assert calendar["VERSION"] == "2.0" and "gpubook" in str(calendar["PRODID"])
    by_uid = {str(event["UID"]): event for event in events(calendar)}
    assert set(by_uid) == {f"reservation-{bookings[key].pk}@gpubook" for key in ("mine_1", "mine_2")}
    for key in ("mine_1", "mine_2"):
        reservation = bookings[key]
        event = by_uid[f"reservation-{reservation.pk}@gpubook"]
        start, end = event.decoded("DTSTART"), event.decoded("DTEND")
        assert start == reservation.start and end == reservation.end
        assert start.utcoffset() == dt.timedelta(0) and end.utcoffset() == dt.timedelta(0)
    first = by_uid[f"reservation-{bookings['mine_1'].pk}@gpubook"]
    assert str(first["SUMMARY"]) == "node-a GPUs 0, 1 (vision)"
    assert "Note: sweep" in str(first["DESCRIPTION"])
    assert str(first["STATUS"]) == "CONFIRMED"
    assert str(first["URL"]).endswith(f"/reservations/{bookings['mine_1'].pk}/")


def test_raw_times_are_utc_z_form(people, bookings):
    body = Client().get(f"/ical/{token_of(people['owner'])}.ics").content.decode()
    start = bookings["mine_1"].start.astimezone(UTC)
    assert f"DTSTART:{start:%Y%m%dT%H%M%S}Z" in body
    assert "VTIMEZONE" not in body and "TZID" not in body


def test_another_users_token_never_shows_my_bookings(people, bookings):
    mine = {f"reservation-{bookings[key].pk}@gpubook" for key in ("mine_1", "mine_2")}
    for persona in ("teammate", "outsider", "manager", "admin"):
        uids = {str(event["UID"]) for event in events(fetch(token_of(people[persona])))}
        assert not uids & mine, persona
    teammate_uids = {str(event["UID"]) for event in events(fetch(token_of(people["teammate"])))}
    assert teammate_uids == {f"reservation-{bookings['teammate'].pk}@gpubook"}
    body = Client().get(f"/ical/{token_of(people['outsider'])}.ics").content.decode()
    assert "alice" not in body and "sweep" not in body


def test_cancelled_bookings_leave_the_feed(people, bookings):
    services.reservation_cancel(reservation_id=bookings["mine_2"].pk, actor=people["owner"], now=timezone.now())
    uids = {str(event["UID"]) for event in events(fetch(token_of(people["owner"])))}
    assert uids == {f"reservation-{bookings['mine_1'].pk}@gpubook"}


def test_unknown_token_is_404(db):
    assert Client().get("/ical/not-a-token.ics").status_code == 404
    assert Client().get("/ical/.ics").status_code == 404


def test_regenerating_invalidates_the_old_url(people, bookings):
    old = token_of(people["owner"])
    client = Client()
    client.force_login(people["owner"])
    response = client.post("/profile/calendar-token/")
    assert response.status_code == 302
    new = token_of(people["owner"])
    assert new != old and len(new) >= 40
    assert Client().get(f"/ical/{old}.ics").status_code == 404
    assert len(events(fetch(new))) == 2
    assert f"/ical/{new}.ics" in client.get("/profile/").content.decode()
