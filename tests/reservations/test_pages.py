"""The booking pages: calendar, events feed, htmx partials, the no-JS form, permissions, CSRF
and the feed's query budget. Personas from tests/conftest.py: alice (owner, vision), dave
(teammate), bob (vision manager), carol (outsider, nlp), admin."""

import datetime as dt
import json
import re
import zoneinfo

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from gpus.models import Gpu, MaintenanceWindow, Node
from reservations import services
from reservations.models import Reservation, ReservationGpu, Team, UserProfile
from tests.support import book, client_for

UTC = dt.UTC
HTMX = {"HTTP_HX_REQUEST": "true"}


def set_zone(user, zone: str) -> None:
    UserProfile.objects.update_or_create(user=user, defaults={"time_zone": zone})


def feed(client, start: dt.datetime, end: dt.datetime) -> dict:
    response = client.get("/calendar/events.json", {"start": start.isoformat(), "end": end.isoformat()})
    assert response.status_code == 200, response.content
    return response.json()


def booking_events(data: dict) -> list[dict]:
    return [event for event in data["events"] if event["extendedProps"]["kind"] in ("booking", "busy")]


# --- login -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "/calendar/",
        "/calendar/events.json?start=2026-01-01T00:00:00Z&end=2026-01-02T00:00:00Z",
        "/calendar/quotas/",
        "/book/",
        "/reservations/",
        "/reservations/1/",
        "/profile/",
    ],
)
def test_every_page_requires_login(db, url):
    response = Client().get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


def test_htmx_requests_without_login_redirect_the_whole_page(db):
    response = Client().get("/reservations/1/", HTTP_HX_CURRENT_URL="http://testserver/calendar/?view=day", **HTMX)
    assert response.status_code == 200
    assert response["HX-Redirect"] == "/accounts/login/?next=%2Fcalendar%2F%3Fview%3Dday"


def test_root_goes_to_the_calendar_and_login_page_renders(db):
    assert Client().get("/")["Location"] == "/calendar/"
    page = Client().get("/accounts/login/")
    assert page.status_code == 200
    assert b'name="username"' in page.content


def test_login_then_lands_on_calendar(people):
    client = Client()
    response = client.post("/accounts/login/", {"username": "alice", "password": "pw-alice"})
    assert response.status_code == 302 and response["Location"] == "/calendar/"


def test_posts_require_login(people, inventory):
    response = Client().post("/book/", {})
    assert response.status_code == 302


# --- calendar page -------------------------------------------------------------------------------


def test_calendar_page_has_config_quota_bars_and_vendored_scripts(people, inventory):
    set_zone(people["owner"], "Europe/Berlin")
    response = client_for(people["owner"]).get("/calendar/?view=day&date=2026-03-29")
    assert response.status_code == 200
    html = response.content.decode()
    config = json.loads(re.search(r'<script id="calendar-config" type="application/json">(.*?)</script>', html).group(1))
    assert config["view"] == "day" and config["date"] == "2026-03-29"
    assert config["timeZone"] == "Europe/Berlin" and config["offset"] in ("+01:00", "+02:00")
    assert config["feedUrl"] == "/calendar/events.json"
    assert "/static/vendor/event-calendar/5.10.1/event-calendar.min.js" in html
    assert "/static/vendor/htmx/2.0.11/htmx.min.js" in html
    assert "cdn." not in html
    assert 'hx-headers=\'{"X-CSRFToken": "' in html  # every htmx request carries the token
    assert "vision" in html and "GPU-h used" in html
    for link in ("Calendar", "My reservations", "Book a slot", "Jobs", "Models"):
        assert link in html


def test_profile_is_created_lazily_with_the_default_zone(people, inventory, settings):
    assert not UserProfile.objects.filter(user=people["teammate"]).exists()
    client_for(people["teammate"]).get("/calendar/")
    assert UserProfile.objects.get(user=people["teammate"]).time_zone == settings.TIME_ZONE


# --- events feed --------------------------------------------------------------------------------


def test_feed_resources_are_gpus_grouped_by_node(people, inventory, future_day):
    data = feed(client_for(people["owner"]), future_day, future_day + dt.timedelta(days=1))
    assert [node["title"] for node in data["resources"]] == ["node-a", "node-b"]
    node_a = data["resources"][0]
    assert [child["id"] for child in node_a["children"]] == [str(gpu.pk) for gpu in inventory["a"]]
    assert node_a["children"][0]["title"] == "GPU 0 · A100 · 80 GiB"
    assert node_a["extendedProps"]["gpus"] == [str(gpu.pk) for gpu in inventory["a"]]
    assert data["resources"][1]["children"][1]["title"] == "GPU 1 · L40S · 44 GiB"


def test_feed_shows_own_and_team_bookings_in_full(people, inventory, future_day):
    vision = people["vision"]
    mine = book(people["owner"], vision, inventory["a"][:2], future_day + dt.timedelta(hours=8), note="sweep")
    theirs = book(people["teammate"], vision, inventory["a"][2:3], future_day + dt.timedelta(hours=8))
    events = {e["id"]: e for e in booking_events(feed(client_for(people["owner"]), future_day, future_day + dt.timedelta(days=1)))}
    own = events[f"r{mine.pk}"]
    assert own["title"] == "You · vision · sweep"
    assert own["resourceIds"] == [str(inventory["a"][0].pk), str(inventory["a"][1].pk)]
    assert own["start"] == (future_day + dt.timedelta(hours=8)).replace(tzinfo=None).isoformat()
    assert "is-mine" in own["classNames"] and "st-confirmed" in own["classNames"]
    team = events[f"r{theirs.pk}"]
    assert team["title"] == "dave · vision" and team["extendedProps"]["user"] == "dave"
    assert "is-team" in team["classNames"]


def test_outsider_sees_other_teams_only_as_busy(people, inventory, future_day):
    mine = book(people["owner"], people["vision"], inventory["a"][:1], future_day + dt.timedelta(hours=8), note="secret")
    data = feed(client_for(people["outsider"]), future_day, future_day + dt.timedelta(days=1))
    (event,) = booking_events(data)
    assert event["title"] == "vision · busy"
    assert event["extendedProps"] == {"kind": "busy", "team": "vision"}
    assert "is-busy" in event["classNames"]
    body = json.dumps(data)
    assert "alice" not in body and "secret" not in body and f"r{mine.pk}" not in body
    # The outsider cannot open the booking either.
    assert client_for(people["outsider"]).get(f"/reservations/{mine.pk}/", **HTMX).status_code == 404


def test_admin_sees_every_booking_in_full(people, inventory, future_day):
    mine = book(people["owner"], people["vision"], inventory["a"][:1], future_day + dt.timedelta(hours=8))
    (event,) = booking_events(feed(client_for(people["admin"]), future_day, future_day + dt.timedelta(days=1)))
    assert event["id"] == f"r{mine.pk}" and event["extendedProps"]["user"] == "alice"


def test_feed_colours_by_team_and_status_and_hides_cancelled(people, inventory, future_day):
    kept = book(people["owner"], people["vision"], inventory["a"][:1], future_day + dt.timedelta(hours=8))
    gone = book(people["owner"], people["vision"], inventory["a"][1:2], future_day + dt.timedelta(hours=8))
    services.reservation_cancel(reservation_id=gone.pk, actor=people["owner"], now=timezone.now())
    other = book(people["outsider"], people["nlp"], inventory["b"][:1], future_day + dt.timedelta(hours=8))
    events = booking_events(feed(client_for(people["owner"]), future_day, future_day + dt.timedelta(days=1)))
    assert len(events) == 2
    colours = {e["extendedProps"]["team"]: [c for c in e["classNames"] if c.startswith("team-c")] for e in events}
    assert colours["vision"] != colours["nlp"]
    assert {e["id"] for e in events} >= {f"r{kept.pk}"} and other.pk  # the nlp one is opaque


def test_feed_includes_maintenance(people, inventory, future_day):
    window = MaintenanceWindow.objects.create(
        node=inventory["node_b"], start=future_day + dt.timedelta(hours=1), end=future_day + dt.timedelta(hours=3),
        reason="driver upgrade",
    )
    listed = MaintenanceWindow.objects.create(
        node=inventory["node_a"], start=future_day + dt.timedelta(hours=5), end=future_day + dt.timedelta(hours=6),
        reason="fan swap",
    )
    listed.gpus.add(inventory["a"][3])
    data = feed(client_for(people["outsider"]), future_day, future_day + dt.timedelta(days=1))
    by_id = {e["id"]: e for e in data["events"]}
    assert by_id[f"m{window.pk}"]["resourceIds"] == [str(gpu.pk) for gpu in inventory["b"]]
    assert by_id[f"m{window.pk}"]["title"] == "Maintenance · driver upgrade"
    assert by_id[f"m{listed.pk}"]["resourceIds"] == [str(inventory["a"][3].pk)]


def test_feed_times_are_wall_clock_in_the_viewers_zone_and_dst_days_are_right(people, inventory):
    """Berlin springs forward on 2026-03-29 at 02:00 → 03:00. A booking 00:00–02:00 UTC is
    01:00–04:00 on the wall clock; the skipped hour is marked. The calendar cannot show this
    with one fixed offset, hence floating wall-clock strings."""
    set_zone(people["owner"], "Europe/Berlin")
    start = dt.datetime(2026, 3, 29, 0, 0, tzinfo=UTC)
    Reservation.objects.all().delete()
    reservation = Reservation.objects.create(
        user=people["owner"], team=people["vision"], node=inventory["node_a"], gpu_count=1,
        start=start, end=start + dt.timedelta(hours=2), created_at=start, updated_at=start,
    )
    ReservationGpu.objects.create(reservation=reservation, gpu=inventory["a"][0], start=reservation.start, end=reservation.end)
    after = Reservation.objects.create(
        user=people["owner"], team=people["vision"], node=inventory["node_a"], gpu_count=1,
        start=dt.datetime(2026, 3, 29, 8, 0, tzinfo=UTC), end=dt.datetime(2026, 3, 29, 9, 0, tzinfo=UTC),
        created_at=start, updated_at=start,
    )
    ReservationGpu.objects.create(reservation=after, gpu=inventory["a"][0], start=after.start, end=after.end)
    client = client_for(people["owner"])
    data = client.get("/calendar/events.json", {"start": "2026-03-29T00:00:00", "end": "2026-03-30T00:00:00"}).json()
    events = {e["id"]: e for e in data["events"]}
    assert (events[f"r{reservation.pk}"]["start"], events[f"r{reservation.pk}"]["end"]) == (
        "2026-03-29T01:00:00", "2026-03-29T04:00:00",
    )
    assert (events[f"r{after.pk}"]["start"], events[f"r{after.pk}"]["end"]) == ("2026-03-29T10:00:00", "2026-03-29T11:00:00")
    (skipped,) = [e for e in data["events"] if e["extendedProps"]["kind"] == "dst-skipped"]
    assert (skipped["start"], skipped["end"]) == ("2026-03-29T02:00:00", "2026-03-29T03:00:00")
    # Autumn: 2026-10-25 03:00 CEST → 02:00 CET; 02:00–03:00 happens twice.
    data = client.get("/calendar/events.json", {"start": "2026-10-25T00:00:00", "end": "2026-10-26T00:00:00"}).json()
    (repeated,) = [e for e in data["events"] if e["extendedProps"]["kind"] == "dst-repeated"]
    assert (repeated["start"], repeated["end"]) == ("2026-10-25T02:00:00", "2026-10-25T03:00:00")


def test_feed_refuses_bad_ranges(people, inventory):
    client = client_for(people["owner"])
    assert client.get("/calendar/events.json", {"start": "nope", "end": "2026-01-01T00:00:00Z"}).status_code == 400
    response = client.get("/calendar/events.json", {"start": "2026-01-01T00:00:00Z", "end": "2026-06-01T00:00:00Z"})
    assert response.status_code == 400 and response.json()["code"] == "invalid_range"


def test_feed_query_budget_64_gpus_7_days_2000_bookings(people, future_day):
    """The calendar's week: 64 GPUs on 8 nodes, 2,000 bookings, one maintenance window."""
    nodes = Node.objects.bulk_create(Node(name=f"node-{n:02d}") for n in range(8))
    Gpu.objects.bulk_create(
        Gpu(node=node, index=i, model_name="NVIDIA H100", memory_mib=81559) for node in nodes for i in range(8)
    )
    gpus = list(Gpu.objects.order_by("node__name", "index"))
    week_start = future_day
    teams = [people["vision"], people["nlp"]]
    users = [people["owner"], people["outsider"]]
    # 2,000 bookings, none overlapping: GPU g gets one every 5 hours (2–4 h long, starting
    # 0–60 min into its 5 h step), so each GPU holds ≈ 31 of them across the 7 days.
    reservations, spans = [], []
    for number in range(2000):
        gpu = gpus[number % 64]
        step = number // 64
        start = week_start + dt.timedelta(minutes=300 * step + 30 * (number % 64 % 3))
        end = start + dt.timedelta(minutes=120 + 30 * (number % 5))
        owner = number % 2
        reservations.append(
            Reservation(
                user=users[owner], team=teams[owner], node_id=gpu.node_id, gpu_count=1, start=start, end=end,
                created_at=start, updated_at=start, note=f"run {number}",
            )
        )
        spans.append(gpu)
    created = Reservation.objects.bulk_create(reservations)
    ReservationGpu.objects.bulk_create(
        ReservationGpu(reservation=r, gpu=gpu, start=r.start, end=r.end) for r, gpu in zip(created, spans, strict=True)
    )
    window = MaintenanceWindow.objects.create(
        node=nodes[0], start=week_start, end=week_start + dt.timedelta(hours=1), reason="firmware"
    )
    window.gpus.add(gpus[0])
    client = client_for(people["owner"])
    client.get("/calendar/")  # makes the profile, so the measured request only reads
    with CaptureQueriesContext(connection) as captured:
        data = feed(client, week_start, week_start + dt.timedelta(days=7))
    # 1 session, 2 user, 3 profile, 4 memberships, 5 GPUs with node names,
    # 6 booked GPU rows joined with reservation/team/user, 7 the jobs of the bookings shown
    # in full (training's booking_details), 8 maintenance windows, 9 the GPUs those windows list.
    assert len(captured) == 9, [q["sql"][:120] for q in captured.captured_queries]
    assert len(captured) <= 10
    assert len(booking_events(data)) == 2000
    assert sum(len(node["children"]) for node in data["resources"]) == 64


# --- booking: htmx partial and the no-JS form ------------------------------------------------------


def test_booking_partial_is_prefilled_from_a_calendar_selection(people, inventory, future_day):
    set_zone(people["owner"], "Europe/Berlin")
    local_day = future_day.date()
    params = {"gpu": [inventory["a"][1].pk], "start": f"{local_day}T10:00:00", "end": f"{local_day}T12:30:00"}
    response = client_for(people["owner"]).get("/book/", params, **HTMX)
    html = response.content.decode()
    assert response.status_code == 200 and "<html" not in html  # a partial
    assert f'value="{inventory["a"][1].pk}" checked' in html
    assert f'value="{inventory["a"][0].pk}"' in html and f'value="{inventory["b"][0].pk}"' not in html  # this node only
    assert f'value="{local_day}"' in html and 'value="10:00"' in html and 'value="12:30"' in html
    assert "Times are in Europe/Berlin" in html


def _form(gpus, day, start="10:00", end="12:00", team=None, **extra):
    return {"gpus": [gpu.pk for gpu in gpus], "team": team.pk, "date": day.isoformat(), "start_time": start,
            "end_time": end, "note": "", **extra}


def test_booking_by_htmx_creates_and_tells_the_calendar_to_refresh(people, inventory, future_day):
    set_zone(people["owner"], "Europe/Berlin")
    client = client_for(people["owner"])
    response = client.post("/book/", _form(inventory["a"][:2], future_day.date(), team=people["vision"]), **HTMX)
    assert response.status_code == 200
    reservation = Reservation.objects.get()
    berlin = zoneinfo.ZoneInfo("Europe/Berlin")
    assert reservation.start == dt.datetime.combine(future_day.date(), dt.time(10), berlin)
    assert reservation.gpu_count == 2 and reservation.user == people["owner"]
    assert "reservations-changed" in response["HX-Trigger"]
    assert f"Reservation #{reservation.pk} is confirmed" in response.content.decode()


def test_booking_conflict_is_shown_inline_naming_what_collides(people, inventory, future_day):
    taken = book(people["teammate"], people["vision"], inventory["a"][:1], future_day + dt.timedelta(hours=10))
    client = client_for(people["owner"])
    response = client.post(
        "/book/", _form(inventory["a"][:1], future_day.date(), "11:00", "13:00", team=people["vision"]), **HTMX
    )
    html = response.content.decode()
    assert response.status_code == 200 and "<html" not in html
    assert 'data-error-code="slot_conflict"' in html
    assert "That time is already taken" in html
    day = f"{future_day:%a} {future_day.day} {future_day:%b}"
    assert f"node-a GPU 0 is booked {day}, 10:00–12:00 UTC by vision (dave)." in html
    assert Reservation.objects.count() == 1 and taken.pk


def test_outsider_conflict_does_not_name_the_other_teams_people(people, inventory, future_day):
    book(people["owner"], people["vision"], inventory["a"][:1], future_day + dt.timedelta(hours=10))
    response = client_for(people["outsider"]).post(
        "/book/", _form(inventory["a"][:1], future_day.date(), team=people["nlp"]), **HTMX
    )
    html = response.content.decode()
    assert "by another team." in html and "alice" not in html


def test_quota_error_says_what_is_left(people, inventory, future_day):
    Team.objects.filter(pk=people["vision"].pk).update(monthly_gpu_hours=3)
    response = client_for(people["owner"]).post(
        "/book/", _form(inventory["a"][:2], future_day.date(), "10:00", "12:00", team=people["vision"]), **HTMX
    )
    html = response.content.decode()
    assert 'data-error-code="quota_exceeded"' in html
    assert "vision has 3.0 of 3 GPU-hours left" in html and "needs 4.0" in html


def test_service_times_in_messages_are_shown_in_the_viewers_zone(people, inventory, future_day):
    set_zone(people["owner"], "Asia/Tokyo")
    MaintenanceWindow.objects.create(
        node=inventory["node_a"], start=future_day + dt.timedelta(hours=1), end=future_day + dt.timedelta(hours=3),
        reason="driver upgrade",
    )
    tokyo_day = (future_day + dt.timedelta(hours=1)).astimezone(zoneinfo.ZoneInfo("Asia/Tokyo"))
    response = client_for(people["owner"]).post(
        "/book/", _form(inventory["a"][:1], tokyo_day.date(), "10:00", "11:00", team=people["vision"]), **HTMX
    )
    html = response.content.decode()
    assert 'data-error-code="maintenance"' in html
    assert f"{tokyo_day:%a} {tokyo_day.day} {tokyo_day:%b} 10:00 JST" in html and "+00:00" not in html


def test_no_js_form_books_and_redirects(people, inventory, future_day):
    client = client_for(people["owner"])
    page = client.get("/book/")
    html = page.content.decode()
    assert page.status_code == 200 and "<html" in html and 'action="/book/"' in html
    assert 'type="time"' in html and 'type="date"' in html
    response = client.post("/book/", _form(inventory["b"][:1], future_day.date(), "22:00", "02:00", team=people["vision"]))
    reservation = Reservation.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/reservations/{reservation.pk}/"
    # An end before the start, with no end date, means the next morning.
    assert reservation.end - reservation.start == dt.timedelta(hours=4)
    detail = client.get(response["Location"]).content.decode()
    assert f"Booked: reservation #{reservation.pk}." in detail


def test_no_js_form_shows_conflict_in_words(people, inventory, future_day):
    book(people["teammate"], people["vision"], inventory["a"][:1], future_day + dt.timedelta(hours=10))
    response = client_for(people["owner"]).post(
        "/book/", _form(inventory["a"][:1], future_day.date(), team=people["vision"])
    )
    html = response.content.decode()
    assert response.status_code == 200 and "<html" in html
    assert "That time is already taken" in html and "by vision (dave)" in html
    assert 'value="10:00"' in html  # what the person typed is kept


def test_no_js_form_validates_fields(people, inventory, future_day):
    response = client_for(people["owner"]).post("/book/", {"team": people["vision"].pk, "date": "x"})
    html = response.content.decode()
    assert "Choose at least one GPU." in html and "Enter a valid date." in html
    assert Reservation.objects.count() == 0


def test_a_time_the_clocks_skip_is_refused(people, inventory):
    set_zone(people["owner"], "Europe/Berlin")
    Team.objects.filter(pk=people["vision"].pk).update(max_days_ahead=3650)
    response = client_for(people["owner"]).post(
        "/book/", _form(inventory["a"][:1], dt.date(2030, 3, 31), "02:00", "04:00", team=people["vision"])
    )
    assert "02:00 on 2030-03-31 does not exist in Europe/Berlin" in response.content.decode()
    assert Reservation.objects.count() == 0


def test_booking_for_a_team_you_are_not_in_is_refused(people, inventory, future_day):
    response = client_for(people["outsider"]).post(
        "/book/", _form(inventory["a"][:1], future_day.date(), team=people["vision"])
    )
    assert "Select a valid choice" in response.content.decode()
    assert Reservation.objects.count() == 0


# --- CSRF --------------------------------------------------------------------------------------------


def test_csrf_is_enforced_on_the_form_and_on_htmx_posts(people, inventory, future_day):
    client = client_for(people["owner"], enforce_csrf_checks=True)
    data = _form(inventory["a"][:1], future_day.date(), team=people["vision"])
    assert client.post("/book/", data).status_code == 403
    assert client.post("/book/", data, **HTMX).status_code == 403
    page = client.get("/calendar/").content.decode()
    token = re.search(r'"X-CSRFToken": "([^"]+)"', page).group(1)
    response = client.post("/book/", data, HTTP_X_CSRFTOKEN=token, **HTMX)  # what htmx sends
    assert response.status_code == 200 and Reservation.objects.count() == 1
    reservation = Reservation.objects.get()
    assert client.post(f"/reservations/{reservation.pk}/cancel/").status_code == 403
    assert client.post(f"/reservations/{reservation.pk}/cancel/", HTTP_X_CSRFTOKEN=token, **HTMX).status_code == 200
    assert client.post("/profile/calendar-token/").status_code == 403


# --- details panel and its actions ------------------------------------------------------------------


def test_details_panel_offers_what_the_viewer_may_do(people, inventory, future_day):
    reservation = book(people["owner"], people["vision"], inventory["a"][:1], future_day + dt.timedelta(hours=10))
    url = f"/reservations/{reservation.pk}/"
    owner = client_for(people["owner"]).get(url, **HTMX).content.decode()
    assert "<html" not in owner and "Cancel booking" in owner and "Move, shorten or extend" in owner
    teammate = client_for(people["teammate"]).get(url, **HTMX).content.decode()
    assert "Booked by" in teammate and "Cancel booking" not in teammate and "Nothing to change here." in teammate
    manager = client_for(people["manager"]).get(url, **HTMX).content.decode()
    assert "Cancel booking" in manager
    page = client_for(people["owner"]).get(url).content.decode()
    assert "<html" in page and "Cancel booking" in page


def test_cancel_from_the_panel(people, inventory, future_day):
    reservation = book(people["owner"], people["vision"], inventory["a"][:1], future_day + dt.timedelta(hours=10))
    response = client_for(people["owner"]).post(f"/reservations/{reservation.pk}/cancel/", **HTMX)
    assert response.status_code == 200 and "reservations-changed" in response["HX-Trigger"]
    assert "Cancelled" in response.content.decode()
    reservation.refresh_from_db()
    assert reservation.status == Reservation.Status.CANCELLED


def test_cancel_without_js_redirects_back(people, inventory, future_day):
    reservation = book(people["owner"], people["vision"], inventory["a"][:1], future_day + dt.timedelta(hours=10))
    client = client_for(people["owner"])
    response = client.post(f"/reservations/{reservation.pk}/cancel/", {"next": "/reservations/"})
    assert response.status_code == 302 and response["Location"] == "/reservations/"
    assert f"Reservation #{reservation.pk} cancelled." in client.get("/reservations/").content.decode()
    again = client.post(f"/reservations/{reservation.pk}/cancel/", {"next": "/reservations/"})
    assert again.status_code == 200 and "A cancelled booking cannot be cancelled." in again.content.decode()
    other = book(people["owner"], people["vision"], inventory["a"][1:2], future_day + dt.timedelta(hours=10))
    evil = client.post(f"/reservations/{other.pk}/cancel/", {"next": "https://evil.example/"})
    assert evil["Location"] == f"/reservations/{other.pk}/"  # never an open redirect


def test_outsider_and_teammate_cannot_change_a_booking(people, inventory, future_day):
    reservation = book(people["owner"], people["vision"], inventory["a"][:1], future_day + dt.timedelta(hours=10))
    assert client_for(people["outsider"]).post(f"/reservations/{reservation.pk}/cancel/", **HTMX).status_code == 404
    response = client_for(people["teammate"]).post(f"/reservations/{reservation.pk}/cancel/", **HTMX)
    assert "Only the booker, a team manager or an admin may change this booking." in response.content.decode()
    reservation.refresh_from_db()
    assert reservation.status == Reservation.Status.CONFIRMED


def test_shorten_and_extend_from_the_panel(people, inventory, future_day):
    reservation = book(people["owner"], people["vision"], inventory["a"][:1], future_day + dt.timedelta(hours=10))
    client = client_for(people["owner"])
    day = future_day.date()
    response = client.post(
        f"/reservations/{reservation.pk}/reschedule/", {"start": f"{day}T10:00", "end": f"{day}T11:00"}, **HTMX
    )
    assert response.status_code == 200 and "reservations-changed" in response["HX-Trigger"]
    reservation.refresh_from_db()
    assert reservation.end == future_day + dt.timedelta(hours=11)
    blocker = book(people["teammate"], people["vision"], inventory["a"][:1], future_day + dt.timedelta(hours=12))
    response = client.post(
        f"/reservations/{reservation.pk}/reschedule/", {"start": f"{day}T10:00", "end": f"{day}T13:00"}, **HTMX
    )
    assert "That time is already taken" in response.content.decode() and blocker.pk
    reservation.refresh_from_db()
    assert reservation.end == future_day + dt.timedelta(hours=11)


def test_release_a_running_booking(people, inventory):
    now = timezone.now()
    slot_start = now.replace(minute=0 if now.minute < 30 else 30, second=0, microsecond=0)
    reservation = services.reservation_create(
        user=people["owner"], team=people["vision"], gpu_ids=[inventory["a"][0].pk],
        start=slot_start, end=slot_start + dt.timedelta(hours=3), now=slot_start,
    )
    client = client_for(people["owner"])
    panel = client.get(f"/reservations/{reservation.pk}/", **HTMX).content.decode()
    assert "Release early" in panel and "Cancel booking" not in panel and "Shorten or extend" in panel
    response = client.post(f"/reservations/{reservation.pk}/release/", **HTMX)
    assert response.status_code == 200 and "Released early" in response.content.decode()
    reservation.refresh_from_db()
    assert reservation.status == Reservation.Status.RELEASED and reservation.end < slot_start + dt.timedelta(hours=3)


# --- other partials and pages -------------------------------------------------------------------------


def test_quota_bars_partial(people, inventory, future_day):
    response = client_for(people["owner"]).get("/calendar/quotas/", **HTMX)
    html = response.content.decode()
    assert "<html" not in html and "vision" in html and "nlp" not in html
    assert "100 left" in html
    assert 'role="meter"' in html


def test_my_reservations_lists_only_mine(people, inventory, future_day):
    mine = book(people["owner"], people["vision"], inventory["a"][:1], future_day + dt.timedelta(hours=10), note="mine")
    theirs = book(people["teammate"], people["vision"], inventory["a"][1:2], future_day + dt.timedelta(hours=10))
    html = client_for(people["owner"]).get("/reservations/").content.decode()
    assert f"#{mine.pk}" in html and f"#{theirs.pk}<" not in html
    assert f"Cancel #{mine.pk}" in html


def test_profile_changes_time_zone(people, inventory):
    client = client_for(people["owner"])
    assert client.post("/profile/", {"time_zone": "Nowhere/City"}).status_code == 200
    response = client.post("/profile/", {"time_zone": "Asia/Tokyo"})
    assert response.status_code == 302
    assert UserProfile.objects.get(user=people["owner"]).time_zone == "Asia/Tokyo"
    page = client.get("/profile/").content.decode()
    token = UserProfile.objects.get(user=people["owner"]).calendar_token
    assert f"/ical/{token}.ics" in page
