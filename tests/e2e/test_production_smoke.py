"""Production smoke test: what a new user gets from "Running it for real". gunicorn with
DEBUG=false and hashed static files (collectstatic first, served by WhiteNoise), a real Celery
worker and beat on Redis, PostgreSQL; headless Chromium logs in, sees every GPU row of the
calendar with its stylesheet and scripts (no 404 under /static/, no JavaScript error, no CSP
violation), drags to book a slot, sees the conflict for an overlapping one, and the job
attached to the booking starts in its slot. This is the test that catches a blank calendar."""

import datetime as dt
import json
import os
import re
import sys
import time
import urllib.request
import zoneinfo
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.db import connection
from django.utils import timezone
from playwright.sync_api import expect

from gpus.models import Gpu, Node
from reservations import services
from reservations.models import Membership, Reservation, Team, UserProfile
from reservations.timegrid import ceil_to_slot
from tests.e2e.production import ROOT, collectstatic, production_env, production_stack
from tests.e2e.test_calendar import drag
from training.models import Run, TrainingImage
from training.services import job_submit

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.django_db(transaction=True)]

REDIS_DB = int(os.environ.get("GPUBOOK_TEST_REDIS_DB", "7"))
SLOT_RECORDER = str(ROOT / "tests" / "fakes" / "slot_recorder.py")
BUILD = ROOT / "build"


def midday_zone(now: dt.datetime) -> zoneinfo.ZoneInfo:
    """A whole-hour zone where it is about noon now, so a two-slot drag never crosses midnight
    whenever the suite runs. (Etc/GMT-3 is UTC+3: the POSIX sign is inverted.)"""
    offset = 12 - now.astimezone(dt.UTC).hour
    return zoneinfo.ZoneInfo("UTC" if offset == 0 else f"Etc/GMT{-offset:+d}")


@pytest.fixture
def stack(tmp_path, postgres_only):
    try:
        redis.Redis.from_url(f"redis://127.0.0.1:6379/{REDIS_DB}").flushdb()
    except redis.ConnectionError:
        pytest.fail("Redis is not reachable at 127.0.0.1:6379 (start it: see README)")
    db = connection.settings_dict
    env = production_env(
        database_url=f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        redis_url=f"redis://127.0.0.1:6379/{REDIS_DB}", var_dir=tmp_path / "var", static_root=tmp_path / "static",
        GPUBOOK_TICK_SECONDS="1", GPUBOOK_STOP_GRACE_SECONDS="2",
        GPUBOOK_NO_SHOW_MINUTES="600",  # the booked slot began minutes ago; nothing may release it
        # The stand-in job is a command job: on a local executor without a job user those run
        # only on a declared single-user workstation (README "Job isolation").
        GPUBOOK_SINGLE_USER="true",
    )
    collectstatic(env)
    assert (tmp_path / "static" / "staticfiles.json").exists()
    with production_stack(env, tmp_path) as url:
        yield url, tmp_path


@pytest.fixture
def world():
    now = timezone.now()
    zone = midday_zone(now)
    TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")
    team = Team.objects.create(name="vision", slug="vision", monthly_gpu_hours=1000, time_zone=zone.key)
    users = {}
    for name in ("alice", "dave"):
        # The test settings hash with MD5, which the production server does not accept.
        hasher = PBKDF2PasswordHasher()
        users[name] = get_user_model().objects.create(
            username=name, password=hasher.encode(f"pw-{name}", hasher.salt(), iterations=1000))
        Membership.objects.create(user=users[name], team=team)
        UserProfile.objects.update_or_create(user=users[name], defaults={"time_zone": zone.key})
    gpus = []
    for node_name, count in (("node-a", 4), ("node-b", 2)):
        node = Node.objects.create(name=node_name)
        gpus += [Gpu.objects.create(node=node, index=i, model_name="NVIDIA A100", memory_mib=81920)
                 for i in range(count)]
    return {"zone": zone, "team": team, "gpus": gpus, **users}


def test_production_stack_end_to_end(stack, world, browser, screenshots):
    url, tmp_path = stack
    zone = world["zone"]

    # Compressed on the wire, hashed static names with a far-future cache.
    context = browser.new_context(viewport={"width": 1440, "height": 900}, timezone_id="UTC", locale="en-GB")
    context.add_init_script("""
        window.__csp = [];
        document.addEventListener("securitypolicyviolation", (e) => window.__csp.push(e.violatedDirective + " " + e.blockedURI));
        new MutationObserver((_, observer) => {
            if (document.querySelector(".ec-resource, .ec-row-head")) {
                requestAnimationFrame(() => { window.__calendarPaint = performance.now(); });
                observer.disconnect();
            }
        }).observe(document, {childList: true, subtree: true});
    """)
    page = context.new_page()
    page.set_default_timeout(15_000)
    errors, static_failures, static_loaded = [], [], []
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    page.on("pageerror", lambda error: errors.append(str(error)))

    def on_response(response):
        if response.status >= 400:
            errors.append(f"{response.status} {response.url}")
        if "/static/" in response.url:
            (static_failures if response.status >= 400 else static_loaded).append((response.status, response.url))

    page.on("response", on_response)
    page.on("requestfailed", lambda request: errors.append(f"failed: {request.url}"))

    page.goto(f"{url}/calendar/")
    assert "/accounts/login/" in page.url
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("pw-alice")
    # The week view's feed must have loaded before the day view is opened: a navigation
    # aborts a fetch still under way, which the failed-request check would count (CI saw it).
    with page.expect_response(lambda response: "/calendar/events.json" in response.url) as week_feed:
        page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{url}/calendar/**")
    assert week_feed.value.status == 200 and week_feed.value.finished() is None

    # The bookings below are of the slot under way, bookable only until it ends (then
    # "past_slot"). They take well under a minute: with less than three minutes of the slot
    # left, wait for the next slot to begin rather than race its end (CI once crossed it
    # between the first booking and the conflicting one).
    now = timezone.now()
    slot_left_s = (ceil_to_slot(now, slot_minutes=settings.GPUBOOK_SLOT_MINUTES) - now).total_seconds()
    if slot_left_s < 180:
        time.sleep(slot_left_s + 1)
    now_local = timezone.now().astimezone(zone)
    day = now_local.date()
    page.goto(f"{url}/calendar/?view=day&date={day.isoformat()}")
    rows = page.locator(".ec-sidebar .ec-row-head")
    for gpu in world["gpus"]:
        expect(rows.filter(has_text=f"GPU {gpu.index} · A100").first).to_be_visible()
    expect(rows.filter(has_text="GPU")).to_have_count(len(world["gpus"]))
    paint_ms = page.evaluate("window.__calendarPaint")
    # The stylesheet and the scripts did load and run.
    assert page.evaluate("typeof window.htmx") == "object"
    assert page.evaluate("typeof window.EventCalendar") == "object"
    sheets = page.evaluate("[...document.styleSheets].map((s) => s.href || '')")
    assert any("/static/css/gpubook." in href for href in sheets), sheets
    assert any("event-calendar.min." in href for href in sheets), sheets
    assert static_loaded and not static_failures, static_failures
    for status, static_url in static_loaded:  # hashed names: gpubook.6ee382a38fc5.css
        assert status in (200, 304) and re.search(r"\.[0-9a-f]{12}\.(js|css)$", static_url), static_url
    css = next(u for _, u in static_loaded if "/static/css/gpubook." in u)
    with urllib.request.urlopen(urllib.request.Request(css, headers={"Accept-Encoding": "gzip"})) as response:  # noqa: S310
        assert response.headers["Content-Encoding"] == "gzip"
        assert "immutable" in response.headers["Cache-Control"] and "max-age=315360000" in response.headers["Cache-Control"]

    # Drag to book GPU 0 of node-a from the current slot for an hour.
    slot_start = now_local.replace(minute=now_local.minute - now_local.minute % 30, second=0, microsecond=0)
    slot_end = slot_start + dt.timedelta(hours=1)
    drag(page, day, "GPU 0 · A100", (slot_start.hour, slot_start.minute), (slot_end.hour, slot_end.minute))
    panel = page.locator("#panel")
    expect(panel.get_by_role("heading", name="Book GPUs")).to_be_visible()
    panel.get_by_label("Note").fill("smoke")
    panel.get_by_role("button", name="Book").click()
    # The slot begins now: the scheduler's 1 s tick may already have made it active.
    expect(panel).to_contain_text(re.compile(r"Reservation #\d+ is (confirmed|active)"))
    expect(page.locator(".ec-event", has_text="You · vision · smoke")).to_be_visible()
    booked = Reservation.objects.get(note="smoke")
    assert (booked.start, booked.end) == (slot_start, slot_end)
    page.screenshot(path=str(screenshots / "production-calendar-booked.png"))

    # Someone else takes GPU 1 meanwhile; this page's overlapping drag gets the conflict in words.
    services.reservation_create(user=world["dave"], team=world["team"], gpu_ids=[world["gpus"][1].pk],
                                start=slot_start, end=slot_end, now=timezone.now(), note="taken")
    panel.get_by_role("button", name="Close").first.click()
    drag(page, day, "GPU 1 · A100", (slot_start.hour, slot_start.minute), (slot_end.hour, slot_end.minute))
    expect(panel.get_by_role("heading", name="Book GPUs")).to_be_visible()
    panel.get_by_role("button", name="Book").click()
    expect(panel.get_by_role("alert")).to_contain_text("That time is already taken")
    expect(panel.get_by_role("alert")).to_contain_text("node-a GPU 1 is booked")
    page.screenshot(path=str(screenshots / "production-booking-conflict.png"))

    assert not errors, errors
    assert page.evaluate("window.__csp") == []
    context.close()

    # The job attached to the booking starts in its slot: Celery beat ticks, the worker's
    # reconcile starts it with the local executor (a stand-in that records when it ran).
    events = tmp_path / "events.jsonl"
    submitted = time.time()
    job_submit(user=world["alice"], now=timezone.now(), reservation_id=booked.pk,
               document={"task_name": "smoke stand-in", "image": "yolo:v8n-cu118", "team": "vision",
                         "command": [sys.executable, SLOT_RECORDER, str(events)]})
    started = wait_for_event(events, "started", timeout=20)
    run = Run.objects.get(job__reservation=booked)
    assert run.state == Run.State.RUNNING and booked.start <= run.started_at <= booked.end
    start_delay = started - submitted
    assert start_delay < 3.0  # within a tick or two of being attached (ticks are 1 s here)

    # Releasing the slot early stops the run gracefully (SIGTERM), through the same stack.
    services.reservation_release(reservation_id=booked.pk, actor=world["alice"], now=timezone.now(),
                                 reason="smoke test done")
    wait_for_event(events, "sigterm", timeout=20)

    BUILD.mkdir(exist_ok=True)
    (BUILD / "production-smoke.json").write_text(json.dumps(
        {"first_calendar_paint_ms": paint_ms, "job_start_after_attach_s": round(start_delay, 3)}, indent=2))
    print(f"first calendar paint {paint_ms:.0f} ms; job started {start_delay:.2f} s after it was attached")


def wait_for_event(path: Path, event: str, *, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            for line in path.read_text().splitlines():
                record = json.loads(line)
                if record["event"] == event:
                    return record["t"]
        time.sleep(0.1)
    pytest.fail(f"no {event!r} from the stand-in job within {timeout} s (worker log in the tmp dir)")
