"""Recurring bookings: an RRULE read in the team's zone, each occurrence booked like a single
booking, one report of refused dates, cancel one or the rest, and the series as iCal."""

import datetime as dt
import zoneinfo

import icalendar
import pytest
from rest_framework.test import APIClient

from config.errors import DomainError
from reservations.models import Reservation
from reservations.recurring import occurrences, series_cancel, series_create, series_ical
from reservations.services import reservation_cancel, reservation_create
from tests.security.tokens import token_for

BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")
NOW = dt.datetime(2027, 3, 1, 8, 0, tzinfo=dt.UTC)
FIRST = dt.datetime(2027, 3, 2, 18, 0, tzinfo=BERLIN)  # a Tuesday; DST begins Sunday 28 March
RULE = "FREQ=WEEKLY;BYDAY=TU;UNTIL=20270331T000000Z"
H = dt.timedelta(hours=1)


@pytest.fixture
def berlin(people):
    people["vision"].time_zone = "Europe/Berlin"
    people["vision"].save(update_fields=["time_zone"])
    return people


def test_wall_clock_time_holds_across_dst():
    starts = occurrences(rule=RULE, first_start=FIRST, zone=BERLIN)
    assert [s.astimezone(BERLIN).strftime("%d %H:%M") for s in starts] == [
        "02 18:00", "09 18:00", "16 18:00", "23 18:00", "30 18:00"]
    assert starts[0].hour == 17 and starts[-1].hour == 16  # UTC: +01:00 before, +02:00 after


@pytest.mark.parametrize(
    ("rule", "code"),
    [("FREQ=WEEKLY;BYDAY=TU", "endless_rule"), ("FREQ=SOMETIMES;COUNT=3", "invalid_rule"),
     ("FREQ=DAILY;COUNT=500", "too_many_occurrences"), ("", "invalid_rule")],
)
def test_bad_rules_are_refused(rule, code):
    with pytest.raises(DomainError) as refused:
        occurrences(rule=rule, first_start=FIRST, zone=BERLIN)
    assert refused.value.code == code


@pytest.mark.django_db
def test_series_books_each_date_reports_refusals_and_cancels_the_rest(berlin, inventory):
    gpu = inventory["a"][0]
    taken = reservation_create(user=berlin["teammate"], team=berlin["vision"], gpu_ids=[gpu.pk],
                               start=dt.datetime(2027, 3, 16, 19, 0, tzinfo=BERLIN),
                               end=dt.datetime(2027, 3, 16, 20, 0, tzinfo=BERLIN), now=NOW)
    report = series_create(user=berlin["owner"], team=berlin["vision"], gpu_ids=[gpu.pk], start=FIRST,
                           end=FIRST + 4 * H, rule=RULE, note="lab", now=NOW)
    assert [r.start.astimezone(BERLIN).day for r in report.booked] == [2, 9, 23, 30]
    assert all(r.end - r.start == 4 * H for r in report.booked)
    assert [(f["start"][:10], f["code"]) for f in report.failed] == [("2027-03-16", "slot_conflict")]
    assert f"#{taken.pk}" in report.failed[0]["detail"] or "collides" in report.failed[0]["detail"]
    # Every occurrence is an ordinary booking of its own month: 4 × 4 GPU-hours and the teammate's hour.
    held = Reservation.objects.filter(team=berlin["vision"], status__in=Reservation.OCCUPYING)
    assert sum(r.gpu_seconds for r in held) == 17 * 3600

    # One occurrence alone is an ordinary booking; the rest of the series goes in one call.
    reservation_cancel(reservation_id=report.booked[1].pk, actor=berlin["owner"], now=NOW)
    cancelled = series_cancel(series_id=report.series.pk, actor=berlin["owner"], now=NOW,
                              from_start=report.booked[2].start)
    assert [r.start.astimezone(BERLIN).day for r in cancelled] == [23, 30]
    assert Reservation.objects.get(pk=report.booked[0].pk).status == Reservation.Status.CONFIRMED
    with pytest.raises(DomainError) as outsider:
        series_cancel(series_id=report.series.pk, actor=berlin["outsider"], now=NOW)
    assert outsider.value.code == "not_found"

    feed = icalendar.Calendar.from_ical(series_ical(series=report.series))
    event = next(c for c in feed.walk("VEVENT"))
    assert event["RRULE"]["FREQ"] == ["WEEKLY"] and event["RRULE"]["BYDAY"] == ["TU"]
    assert event.decoded("DTSTART") == FIRST and str(event["DTSTART"].params["TZID"]) == "Europe/Berlin"
    excluded = sorted(d.dt.day for d in event["EXDATE"].dts) if not isinstance(event["EXDATE"], list) else sorted(
        d.dt.day for x in event["EXDATE"] for d in x.dts)
    assert excluded == [9, 16, 23, 30]  # cancelled, refused, cancelled, cancelled
    assert list(feed.walk("VTIMEZONE"))


@pytest.mark.django_db
def test_series_through_the_api(berlin, inventory):
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token_for(berlin['owner'])}")
    gpu = inventory["a"][1]
    # The API checks against the real clock, so the series lies in the coming weeks.
    start = (dt.datetime.now(dt.UTC) + dt.timedelta(days=2)).replace(minute=0, second=0, microsecond=0)
    body = {"gpus": [gpu.pk], "team": berlin["vision"].pk, "start": start.isoformat(),
            "end": (start + 2 * H).isoformat(), "rrule": "FREQ=DAILY;COUNT=3"}
    created = api.post("/api/v1/series/", body, format="json")
    assert created.status_code == 201, created.json()
    series = created.json()
    assert len(series["booked"]) == 3 and series["failed"] == []
    again = api.post("/api/v1/series/", body, format="json").json()
    assert again["booked"] == [] and [f["code"] for f in again["failed"]] == ["slot_conflict"] * 3
    ics = api.get(f"/api/v1/series/{series['id']}/ical/")
    assert ics.status_code == 200 and b"RRULE:FREQ=DAILY;COUNT=3" in ics.content
    cancelled = api.post(f"/api/v1/series/{series['id']}/cancel/", {}, format="json")
    assert [r["status"] for r in cancelled.json()] == ["cancelled"] * 3
    endless = api.post("/api/v1/series/", {**body, "rrule": "FREQ=DAILY"}, format="json")
    assert endless.status_code == 400 and endless.json()["code"] == "endless_rule"
    outsider = APIClient()
    outsider.credentials(HTTP_AUTHORIZATION=f"Token {token_for(berlin['outsider'])}")
    assert outsider.get(f"/api/v1/series/{series['id']}/").status_code == 404


@pytest.mark.django_db
def test_a_series_may_book_several_gpus_of_one_node(berlin, inventory):
    """Gpu's default ordering once joined the "one node?" DISTINCT, so two GPUs of one node
    read as two nodes and every multi-GPU series was refused (found by tests/security/fuzz_hooks.py)."""
    gpus = inventory["b"]
    report = series_create(user=berlin["owner"], team=berlin["vision"], gpu_ids=[gpu.pk for gpu in gpus],
                           start=FIRST, end=FIRST + H, rule="FREQ=DAILY;COUNT=2", now=NOW)
    assert [sorted(gpu.gpu_id for gpu in r.booked.all()) for r in report.booked] == [[g.pk for g in gpus]] * 2


@pytest.mark.django_db
def test_a_series_of_centuries_is_refused_date_by_date_not_with_a_500(berlin, inventory):
    """Its length once overflowed a 32-bit column (found by tests/security/fuzz_hooks.py)."""
    report = series_create(user=berlin["owner"], team=berlin["vision"], gpu_ids=[inventory["a"][0].pk],
                           start=dt.datetime(1136, 6, 21, 1, 0, tzinfo=dt.UTC), end=NOW, rule="FREQ=WEEKLY;COUNT=1",
                           now=NOW)
    assert report.booked == [] and [failure["code"] for failure in report.failed] == ["past_slot"]
