"""Quota: months in the team's time zone, DST, refunds, daily cap."""

import datetime as dt
import zoneinfo

import pytest

from config.errors import Conflict
from reservations import selectors
from reservations.services import reservation_cancel, reservation_create, reservation_release, reservations_advance

UTC = dt.UTC
H = dt.timedelta(hours=1)
BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")


def book(people, gpus, start, end, now, who="owner"):
    return reservation_create(
        user=people[who], team=people["vision"], gpu_ids=[g.pk for g in gpus], start=start, end=end, now=now
    )


@pytest.fixture
def berlin_team(people):
    team = people["vision"]
    team.time_zone = "Europe/Berlin"
    team.monthly_gpu_hours = 10
    team.save()
    return team


@pytest.mark.django_db
def test_quota_is_enforced_with_what_is_left(people, inventory, berlin_team):
    now = dt.datetime(2026, 6, 10, 8, tzinfo=UTC)
    book(people, inventory["a"][:4], now + H, now + 3 * H, now)  # 8 GPU-hours
    with pytest.raises(Conflict) as refused:
        book(people, inventory["a"][:2], now + 4 * H, now + 6 * H, now)  # 4 more: over 10
    error = refused.value
    assert error.code == "quota_exceeded"
    assert error.extra["remaining_gpu_hours"] == 2.0 and error.extra["requested_gpu_hours"] == 4.0
    assert "2.0 of 10" in error.detail
    assert book(people, inventory["a"][:2], now + 4 * H, now + 5 * H, now).gpu_count == 2  # exactly 10


@pytest.mark.django_db
def test_booking_across_a_month_boundary_is_split(people, inventory, berlin_team):
    # 31 May 22:00 UTC is 1 June 00:00 in Berlin (CEST, UTC+2): a booking from 20:00 to 02:00
    # UTC spends 2 h in Berlin's May and 4 h in Berlin's June.
    now = dt.datetime(2026, 5, 20, tzinfo=UTC)
    start = dt.datetime(2026, 5, 31, 20, tzinfo=UTC)
    book(people, inventory["a"][:1], start, start + 6 * H, now)
    may = selectors.usage_seconds(team=berlin_team, window_start=dt.datetime(2026, 4, 30, 22, tzinfo=UTC),
                                  window_end=dt.datetime(2026, 5, 31, 22, tzinfo=UTC))
    assert may == 2 * 3600
    june = selectors.team_quota_position(team=berlin_team, now=dt.datetime(2026, 6, 2, tzinfo=UTC))
    assert june.month == "2026-06" and june.used_gpu_hours == 4.0
    # June has 6 h left: 8 more on 1 June is refused even though May has room
    with pytest.raises(Conflict) as refused:
        book(people, inventory["a"][1:2], dt.datetime(2026, 6, 1, 2, tzinfo=UTC),
             dt.datetime(2026, 6, 1, 10, tzinfo=UTC), now)
    assert refused.value.extra["month"] == "2026-06" and refused.value.extra["remaining_gpu_hours"] == 6.0


@pytest.mark.django_db
def test_dst_night_counts_real_hours(people, inventory, berlin_team):
    # 2026-03-29: Berlin springs forward at 02:00 local; 00:00–06:00 local is 5 real hours.
    now = dt.datetime(2026, 3, 20, tzinfo=UTC)
    start = dt.datetime(2026, 3, 29, 0, tzinfo=BERLIN)
    end = dt.datetime(2026, 3, 29, 6, tzinfo=BERLIN)
    booking = book(people, inventory["a"][:2], start, end, now)
    assert booking.gpu_seconds == 2 * 5 * 3600
    usage = selectors.team_quota_position(team=berlin_team, now=dt.datetime(2026, 3, 30, tzinfo=UTC))
    assert usage.used_gpu_hours == 10.0 and usage.remaining_gpu_hours == 0.0


@pytest.mark.django_db
def test_month_start_on_autumn_dst(people, inventory, berlin_team):
    # 1 November 2026 00:00 Berlin is 31 October 23:00 UTC (CET, UTC+1, after the October change).
    usage_month = selectors.team_quota_position(team=berlin_team, now=dt.datetime(2026, 10, 31, 23, 30, tzinfo=UTC))
    assert usage_month.month == "2026-11"


@pytest.mark.django_db
def test_cancel_refunds_everything(people, inventory, berlin_team):
    now = dt.datetime(2026, 6, 10, 8, tzinfo=UTC)
    booking = book(people, inventory["a"][:4], now + H, now + 3 * H, now)
    assert selectors.team_quota_position(team=berlin_team, now=now).used_gpu_hours == 8.0
    reservation_cancel(reservation_id=booking.pk, actor=people["owner"], now=now)
    assert selectors.team_quota_position(team=berlin_team, now=now).used_gpu_hours == 0.0


@pytest.mark.django_db
def test_early_release_refunds_the_unused_part(people, inventory, berlin_team):
    now = dt.datetime(2026, 6, 10, 8, tzinfo=UTC)
    booking = book(people, inventory["a"][:2], now, now + 4 * H, now)  # 8 GPU-hours
    reservations_advance(now=now)
    reservation_release(reservation_id=booking.pk, actor=people["owner"], now=now + dt.timedelta(minutes=45),
                        reason="finished")
    # used up to the end of the current slot (08:00–09:00): 2 GPUs × 1 h
    assert selectors.team_quota_position(team=berlin_team, now=now).used_gpu_hours == 2.0


@pytest.mark.django_db
def test_daily_cap_per_user(people, inventory, berlin_team):
    berlin_team.monthly_gpu_hours = 1000
    berlin_team.user_daily_cap_gpu_hours = 6
    berlin_team.save()
    now = dt.datetime(2026, 6, 10, 6, tzinfo=UTC)
    book(people, inventory["a"][:2], now + H, now + 4 * H, now)  # 6 GPU-hours on 10 June (Berlin)
    with pytest.raises(Conflict) as refused:
        book(people, inventory["a"][:1], now + 5 * H, now + 6 * H, now)
    assert refused.value.code == "daily_cap_exceeded" and refused.value.extra["day"] == "2026-06-10"
    # a teammate has their own cap; the next Berlin day is a new day (22:00 UTC = midnight CEST)
    assert book(people, inventory["a"][:1], now + 5 * H, now + 6 * H, now, who="teammate").pk
    assert book(people, inventory["a"][:1], dt.datetime(2026, 6, 10, 22, tzinfo=UTC),
                dt.datetime(2026, 6, 10, 23, tzinfo=UTC), now).pk


# --- one quota position: bookings and backfill together (DESIGN.md "Quota") -----------------------


@pytest.fixture
def backfill_run(people):
    from tests.gpus.factories import make_job, make_run
    from training.models import Run

    def run(gpus, started_at, ended_at=None):
        job = make_job(user=people["owner"], team=people["vision"], submitted_at=started_at)
        return make_run(job=job, gpus=gpus, started_at=started_at, ended_at=ended_at, kind=Run.Kind.BACKFILL)

    return run


@pytest.mark.django_db
def test_backfill_use_leaves_less_to_book(people, inventory, berlin_team, backfill_run, settings):
    settings.GPUBOOK_BACKFILL_USAGE_FACTOR = 0.5
    now = dt.datetime(2026, 6, 10, 8, tzinfo=UTC)
    backfill_run(inventory["a"][:2], now - 5 * H, now - H)  # 2 GPUs × 4 h × 0.5 = 4 GPU-hours
    position = selectors.team_quota_position(team=berlin_team, now=now)
    assert (position.booked_gpu_hours, position.backfill_gpu_hours, position.remaining_gpu_hours) == (0, 4.0, 6.0)
    with pytest.raises(Conflict) as refused:
        book(people, inventory["a"][:4], now + H, now + 3 * H, now)  # 8 wanted, 6 left
    assert refused.value.extra["remaining_gpu_hours"] == 6.0 and refused.value.extra["backfill_gpu_hours"] == 4.0
    book(people, inventory["a"][:3], now + H, now + 3 * H, now)  # exactly 6
    position = selectors.team_quota_position(team=berlin_team, now=now)
    assert (position.used_gpu_hours, position.remaining_gpu_hours, position.level) == (10.0, 0.0, "exhausted")


@pytest.mark.django_db
def test_a_running_backfill_run_is_charged_up_to_now(people, inventory, berlin_team, backfill_run, settings):
    settings.GPUBOOK_BACKFILL_USAGE_FACTOR = 0.5
    now = dt.datetime(2026, 6, 10, 8, tzinfo=UTC)
    backfill_run(inventory["a"][:2], now - 3 * H)
    assert selectors.team_quota_position(team=berlin_team, now=now).backfill_gpu_hours == 3.0
    assert selectors.team_quota_position(team=berlin_team, now=now + H).backfill_gpu_hours == 4.0


@pytest.mark.django_db
def test_month_boundary_splits_bookings_and_backfill_in_the_team_zone(
    people, inventory, berlin_team, backfill_run, settings
):
    # Berlin's June begins 31 May 22:00 UTC. A backfill run 20:00–02:00 UTC on 2 GPUs at 0.5
    # charges 2 GPU-hours to May and 4 to June; a booking 21:00–23:00 UTC on 1 GPU, 1 and 1.
    settings.GPUBOOK_BACKFILL_USAGE_FACTOR = 0.5
    boundary = dt.datetime(2026, 5, 31, 22, tzinfo=UTC)
    book(people, inventory["b"][:1], boundary - H, boundary + H, now=dt.datetime(2026, 5, 20, tzinfo=UTC))
    backfill_run(inventory["a"][:2], boundary - 2 * H, boundary + 4 * H)
    now = dt.datetime(2026, 6, 1, 6, tzinfo=UTC)
    may = selectors.team_quota_position(team=berlin_team, now=now, at=boundary - dt.timedelta(seconds=1))
    june = selectors.team_quota_position(team=berlin_team, now=now)
    assert (may.month, may.booked_gpu_hours, may.backfill_gpu_hours) == ("2026-05", 1.0, 2.0)
    assert (june.month, june.booked_gpu_hours, june.backfill_gpu_hours, june.remaining_gpu_hours) == (
        "2026-06", 1.0, 4.0, 5.0)
    # 6 GPU-hours in June would fit if backfill were not charged (10 − 1 = 9) but 5 are left
    with pytest.raises(Conflict) as refused:
        book(people, inventory["a"][:3], now + H, now + 3 * H, now)
    assert refused.value.extra["month"] == "2026-06" and refused.value.extra["remaining_gpu_hours"] == 5.0
    # a booking ending in May and starting before the boundary is checked against May only
    assert selectors.team_quota_position(team=berlin_team, now=now, at=boundary).month == "2026-06"


@pytest.mark.django_db
def test_every_screen_reads_the_same_position(people, inventory, berlin_team, backfill_run, settings):
    """The booking check, the scheduler snapshot, the report, the calendar bar, the admin
    bar and the API show one figure."""
    from django.test import Client
    from rest_framework.test import APIClient

    from reports import selectors as report_selectors
    from reservations import calendar_feed
    from scheduler.policy import Policy
    from training import snapshot

    settings.GPUBOOK_BACKFILL_USAGE_FACTOR = 0.5
    berlin_team.monthly_gpu_hours = 20
    berlin_team.save()
    now = dt.datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    backfill_run(inventory["a"][:2], now - 5 * H, now - H)  # 4 GPU-hours this month (or 4 across the turn)
    position = selectors.team_quota_position(team=berlin_team, now=now)
    expected = round(position.used_gpu_hours, 2)
    assert position.backfill_gpu_hours > 0
    bar = next(bar for bar in calendar_feed.quota_bars(user=people["owner"], now=now) if bar.team == berlin_team)
    assert round(bar.position.used_gpu_hours, 2) == expected
    row = next(row for row in report_selectors.quota_report(user=people["owner"], now=now) if row.team == "vision")
    assert round(row.used_gpu_hours, 2) == expected
    api = APIClient()
    api.force_authenticate(people["owner"])
    team_row = next(item for item in api.get("/api/v1/teams/").json()["results"] if item["slug"] == "vision")
    assert team_row["usage"]["backfill_gpu_hours"] == round(position.backfill_gpu_hours, 2)
    account = next(a for a in snapshot._team_accounts(now=now, policy=Policy()) if a.team == berlin_team.pk)
    assert account.quota_remaining_gpu_s == pytest.approx(position.remaining_gpu_s)
    admin = Client()
    admin.force_login(people["admin"])
    page = admin.get("/admin/reservations/team/").content.decode()
    assert f"{expected} / 20 GPU-h" in page
