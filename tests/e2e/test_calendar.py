"""The booking calendar in a real headless Chromium: log in, drag to book, see it appear, a
conflict shown in words, the no-JS form, cancelling. Screenshots go to build/screenshots/."""

import datetime as dt
import re
import zoneinfo

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from gpus.models import MaintenanceWindow
from reservations import services
from reservations.models import Reservation, UserProfile

pytestmark = pytest.mark.e2e

BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")


def at(day: dt.date, hour: int, minute: int = 0) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(hour, minute), BERLIN)


def book(user, team, gpus, start, hours=2, note=""):
    return services.reservation_create(
        user=user, team=team, gpu_ids=[gpu.pk for gpu in gpus], start=start,
        end=start + dt.timedelta(hours=hours), now=timezone.now(), note=note,
    )


@pytest.fixture
def world(people, inventory, future_day):
    """Berlin profiles, a few bookings around the day under test, and one maintenance window."""
    for persona in ("owner", "teammate", "outsider"):
        UserProfile.objects.update_or_create(user=people[persona], defaults={"time_zone": "Europe/Berlin"})
    day = future_day.astimezone(BERLIN).date()
    vision, nlp = people["vision"], people["nlp"]
    book(people["teammate"], vision, inventory["a"][:1], at(day, 8), 3, "yolov8m fine-tune")
    book(people["outsider"], nlp, inventory["a"][3:4], at(day, 9), 4, "private eval")
    book(people["outsider"], nlp, inventory["b"][:2], at(day, 13), 5)
    book(people["owner"], vision, inventory["b"][1:2], at(day - dt.timedelta(days=1), 9), 6, "ablation")
    book(people["teammate"], vision, inventory["a"][:2], at(day + dt.timedelta(days=1), 14), 8)
    window = MaintenanceWindow.objects.create(
        node=inventory["node_a"], start=at(day, 16), end=at(day, 18), reason="driver update"
    )
    window.gpus.add(inventory["a"][3])
    return {"day": day, **people, **inventory}


def open_day(page, live_server, day: dt.date):
    page.goto(f"{live_server.url}/calendar/?view=day&date={day.isoformat()}")
    expect(page.locator(".ec-row-head", has_text="GPU 1 · A100 · 80 GiB")).to_be_visible()


def drag(page, day: dt.date, row_text: str, start: tuple[int, int], end: tuple[int, int]):
    """Press on `start` in the row labelled `row_text`, move to `end`, release."""
    row = page.locator(".ec-sidebar .ec-row-head", has_text=row_text).first
    first_hour = page.locator(f'.ec-header time[datetime="{day.isoformat()}T{start[0]:02d}:00:00"]')
    # Scroll the timeline so the start hour sits just right of the (sticky) GPU labels.
    first_hour.evaluate(
        """(time) => {
            let box = time;
            while (box && !(box.scrollWidth > box.clientWidth && getComputedStyle(box).overflowX !== "visible")) {
                box = box.parentElement;
            }
            const sidebar = document.querySelector(".ec-body .ec-sidebar").getBoundingClientRect();
            box.scrollLeft += time.getBoundingClientRect().left - sidebar.right - 40;
        }"""
    )
    last_hour = page.locator(f'.ec-header time[datetime="{day.isoformat()}T{end[0]:02d}:00:00"]')
    slot_start = first_hour.locator("xpath=..").bounding_box()
    slot_end = last_hour.locator("xpath=..").bounding_box()
    hour_width = slot_start["width"]
    y = row.bounding_box()["y"] + row.bounding_box()["height"] / 2
    x0 = slot_start["x"] + hour_width * start[1] / 60 + 4
    x1 = slot_end["x"] + hour_width * end[1] / 60 - 4
    page.mouse.move(x0, y)
    page.mouse.down()
    page.mouse.move(x1, y, steps=12)
    page.mouse.up()


def test_drag_to_book_then_see_it_and_a_conflict(open_page, live_server, world, screenshots):
    page = open_page("alice")
    day = world["day"]
    open_day(page, live_server, day)
    expect(page.locator(".ec-title")).to_contain_text(str(day.day))
    # Other teams show only as busy with their team's name; the team's own in full.
    expect(page.locator(".ec-event", has_text="nlp · busy").first).to_be_visible()
    expect(page.locator(".ec-event", has_text="dave · vision · yolov8m fine-tune")).to_be_visible()
    expect(page.locator(".ec-event", has_text="private eval")).to_have_count(0)
    expect(page.locator(".ec-event", has_text="Maintenance · driver update")).to_have_count(1)
    expect(page.locator("#quota-bars")).to_contain_text("vision")

    drag(page, day, "GPU 1 · A100 · 80 GiB", (10, 0), (12, 0))
    panel = page.locator("#panel")
    expect(panel.get_by_role("heading", name="Book GPUs")).to_be_visible()
    expect(panel.get_by_label("Start")).to_have_value("10:00")
    expect(panel.get_by_label("End", exact=True)).to_have_value("12:00")
    expect(panel.get_by_label("GPU 1 · NVIDIA A100 · 80 GiB")).to_be_checked()
    panel.get_by_label("Note").fill("drag test")
    panel.get_by_role("button", name="Book").click()
    expect(panel).to_contain_text("is confirmed")
    expect(page.locator(".ec-event", has_text="You · vision · drag test")).to_be_visible()
    booked = Reservation.objects.get(note="drag test")
    assert (booked.start, booked.end) == (at(day, 10), at(day, 12))
    assert [gpu.index for gpu in booked.gpus.all()] == [1]
    page.screenshot(path=str(screenshots / "calendar-day-booked.png"))

    # Dragging onto a busy slot is refused before anything is sent.
    panel.get_by_role("button", name="Close").first.click()
    drag(page, day, "GPU 0 · A100 · 80 GiB", (6, 0), (10, 0))
    expect(page.locator("#calendar-status")).to_contain_text("already booked")
    expect(panel).to_be_hidden()

    # Someone else takes GPU 2 while this page is open: the calendar is stale, the server is not.
    book(world["teammate"], world["vision"], world["a"][2:3], at(day, 11), 2, "late arrival")
    drag(page, day, "GPU 2 · A100 · 80 GiB", (10, 30), (12, 0))
    expect(panel.get_by_role("heading", name="Book GPUs")).to_be_visible()
    panel.get_by_role("button", name="Book").click()
    alert = panel.get_by_role("alert")
    expect(alert).to_contain_text("That time is already taken")
    zone = at(day, 13).tzname()  # CET or CEST, depending on when the suite runs
    expect(alert).to_contain_text(f"node-a GPU 2 is booked {day:%a} {day.day} {day:%b}, 11:00–13:00 {zone} by vision (dave).")
    # …and the calendar catches up, showing what it collided with.
    expect(page.locator(".ec-event", has_text="dave · vision · late arrival")).to_be_visible()
    page.screenshot(path=str(screenshots / "booking-conflict.png"))
    assert not Reservation.objects.filter(user=world["owner"], start=at(day, 10, 30)).exists()


def test_drag_on_a_node_row_books_all_its_gpus(open_page, live_server, world):
    page = open_page("alice")
    day = world["day"]
    open_day(page, live_server, day)
    drag(page, day, "node-b", (19, 0), (21, 0))
    panel = page.locator("#panel")
    expect(panel.get_by_label("GPU 0 · NVIDIA L40S · 44 GiB")).to_be_checked()
    expect(panel.get_by_label("GPU 1 · NVIDIA L40S · 44 GiB")).to_be_checked()
    expect(panel.get_by_label("GPU 0 · NVIDIA A100 · 80 GiB")).to_have_count(0)  # only this node's GPUs
    panel.get_by_label("Note").fill("whole node")
    panel.get_by_role("button", name="Book").click()
    expect(page.locator(".ec-event", has_text="You · vision · whole node")).to_have_count(2)
    booked = Reservation.objects.get(note="whole node")
    assert booked.gpu_count == 2 and (booked.start, booked.end) == (at(day, 19), at(day, 21))


def test_week_view_and_past_slots(open_page, live_server, world, screenshots):
    page = open_page("alice")
    page.goto(f"{live_server.url}/calendar/?view=week&date={world['day'].isoformat()}")
    expect(page.locator(".ec-event", has_text="You · vision · ablation")).to_be_visible()
    page.screenshot(path=str(screenshots / "calendar-week.png"))
    page.get_by_role("button", name="Day", exact=True).click()
    page.get_by_role("button", name="Today").click()
    today = timezone.now().astimezone(BERLIN).date()
    expect(page).to_have_url(re.compile(rf"view=day&date={today.isoformat()}"))
    expect(page.locator(".ec-now-indicator")).to_have_count(1)  # the current time, in Berlin
    yesterday = today - dt.timedelta(days=1)
    open_day(page, live_server, yesterday)
    drag(page, yesterday, "GPU 3 · A100 · 80 GiB", (12, 0), (14, 0))
    expect(page.locator("#calendar-status")).to_contain_text("has passed")
    expect(page.locator("#panel")).to_be_hidden()


def test_click_own_booking_and_cancel_it(open_page, live_server, world, screenshots):
    mine = book(world["owner"], world["vision"], world["a"][1:2], at(world["day"], 19), 2, "to cancel")
    page = open_page("alice")
    open_day(page, live_server, world["day"])
    event = page.locator(".ec-event", has_text="You · vision · to cancel")
    event.scroll_into_view_if_needed()
    event.click()
    panel = page.locator("#panel")
    expect(panel.get_by_role("heading", name=f"Reservation #{mine.pk}")).to_be_visible()
    expect(panel).to_contain_text(f"19:00 – 21:00 {at(world['day'], 21).tzname()}")
    page.screenshot(path=str(screenshots / "reservation-panel.png"))
    page.once("dialog", lambda dialog: dialog.accept())
    panel.get_by_role("button", name="Cancel booking").click()
    expect(panel).to_contain_text("Cancelled")
    expect(event).to_have_count(0)
    mine.refresh_from_db()
    assert mine.status == Reservation.Status.CANCELLED



def test_attach_a_waiting_job_in_the_booking_panel_then_detach_it(open_page, live_server, world):
    from tests.factories import make_job

    evening = book(world["owner"], world["vision"], world["a"][1:2], at(world["day"], 19), 2, "evening run")
    job = make_job(user=world["owner"], team=world["vision"], submitted_at=timezone.now(), name="shapes-yolo")
    page = open_page("alice")
    open_day(page, live_server, world["day"])
    event = page.locator(".ec-event", has_text="You · vision · evening run")
    event.scroll_into_view_if_needed()
    event.click()
    section = page.locator("#panel #booking-job")
    expect(section).to_contain_text("No job attached")
    section.get_by_label("Run here").select_option(label="shapes-yolo · alice · 1 GPU")
    section.get_by_role("button", name="Attach").click()
    expect(section).to_contain_text("Runs shapes-yolo")
    expect(page.locator(".ec-event", has_text="evening run · job shapes-yolo")).to_have_count(1)  # the grid names it
    job.refresh_from_db()
    assert job.reservation_id == evening.pk
    section.get_by_role("button", name="Detach").click()
    expect(section).to_contain_text("No job attached")
    job.refresh_from_db()
    assert job.reservation_id is None


def test_book_and_cancel_without_javascript_by_keyboard(open_page, live_server, world, screenshots):
    page = open_page("alice", javascript=False)
    page.get_by_role("link", name="Book a slot", exact=True).click()
    expect(page.get_by_role("heading", name="Book GPUs")).to_be_visible()
    page.get_by_label("GPU 0 · NVIDIA L40S · 44 GiB").focus()
    page.keyboard.press("Space")
    page.get_by_label("Date", exact=True).fill(world["day"].isoformat())
    page.get_by_label("Start").fill("20:00")
    page.get_by_label("End", exact=True).fill("23:30")
    page.get_by_label("Note").fill("no js")
    page.screenshot(path=str(screenshots / "book-form-nojs.png"))
    page.get_by_label("Note").press("Enter")
    expect(page.get_by_role("status")).to_contain_text("Booked: reservation #")
    booked = Reservation.objects.get(note="no js")
    assert (booked.start, booked.end) == (at(world["day"], 20), at(world["day"], 23, 30))

    # The same slot again: the conflict comes back in words, with what was typed kept.
    page.get_by_role("link", name="Book a slot", exact=True).click()
    page.get_by_label("GPU 0 · NVIDIA L40S · 44 GiB").check()
    page.get_by_label("Date", exact=True).fill(world["day"].isoformat())
    page.get_by_label("Start").fill("21:00")
    page.get_by_label("End", exact=True).fill("22:00")
    page.get_by_role("button", name="Book").click()
    expect(page.get_by_role("alert")).to_contain_text("by vision (alice)")
    expect(page.get_by_label("Start")).to_have_value("21:00")

    page.get_by_role("link", name="My reservations", exact=True).click()
    page.get_by_role("button", name=f"Cancel #{booked.pk}").click()
    expect(page.get_by_role("status")).to_contain_text(f"Reservation #{booked.pk} cancelled.")
    page.screenshot(path=str(screenshots / "my-reservations.png"))
    booked.refresh_from_db()
    assert booked.status == Reservation.Status.CANCELLED
