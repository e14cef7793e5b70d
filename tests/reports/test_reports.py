"""Report figures against hand-computed ones on a small fixed dataset, the pages and their
CSV exports, who sees what, and query budgets.

The dataset (January 2025, UTC; "now" is 2025-01-11 00:00, ten days into the month):
  R1 alice/vision  node-a GPU 0      Jan 7 10:00–12:00  idle (5 %) 10:00–11:29, busy (80 %) 11:30–11:59
  R2 carol/nlp     node-a GPU 1      Jan 7 10:30–11:00  50 % throughout
  R3 dave/vision   node-b GPUs 0, 1  Jan 7 13:00–14:00  GPU 0 at 0 %; GPU 1 has no telemetry
  R4 alice/vision  node-a GPU 2      Jan 20 00:00–10:00 (ahead of now)
  R5 alice/vision  node-a GPU 0      Jan 8 10:00–11:00  90 % throughout (same GPU as R1: kept apart)
  a vision backfill run on node-b's 2 GPUs, Jan 8 00:00–02:00 (4 GPU-hours, × 0.5 usage factor)
"""

import csv
import datetime as dt
import io
import types

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

import reports.views
from reports import selectors
from reservations.models import Reservation
from tests.factories import fill_samples, make_job, make_reservation, make_run
from tests.support import client_for
from training.models import Run

UTC = dt.UTC
DAY = dt.datetime(2025, 1, 7, tzinfo=UTC)
NOW = dt.datetime(2025, 1, 11, tzinfo=UTC)
H = dt.timedelta(hours=1)
MIN = dt.timedelta(minutes=1)


@pytest.fixture
def dataset(inventory, people, settings, monkeypatch):
    settings.GPUBOOK_BACKFILL_USAGE_FACTOR = 0.5
    monkeypatch.setattr(reports.views, "timezone", types.SimpleNamespace(now=lambda: NOW))
    a, b = inventory["a"], inventory["b"]
    vision, nlp = people["vision"], people["nlp"]
    r1 = make_reservation(user=people["owner"], team=vision, gpus=[a[0]], start=DAY + 10 * H, end=DAY + 12 * H)
    r2 = make_reservation(user=people["outsider"], team=nlp, gpus=[a[1]], start=DAY + 10.5 * H, end=DAY + 11 * H)
    r3 = make_reservation(user=people["teammate"], team=vision, gpus=b, start=DAY + 13 * H, end=DAY + 14 * H)
    r4 = make_reservation(user=people["owner"], team=vision, gpus=[a[2]], start=dt.datetime(2025, 1, 20, tzinfo=UTC),
                          end=dt.datetime(2025, 1, 20, 10, tzinfo=UTC), status=Reservation.Status.CONFIRMED)
    make_reservation(user=people["owner"], team=vision, gpus=[a[3]], start=DAY + 10 * H, end=DAY + 20 * H,
                     status=Reservation.Status.CANCELLED)  # counts for nothing anywhere
    make_reservation(user=people["owner"], team=vision, gpus=[a[0]], start=DAY + 34 * H, end=DAY + 35 * H)
    fill_samples(a[0], DAY + 34 * H, 60, utilization=0.9)
    fill_samples(a[0], DAY + 10 * H, 120, utilization=lambda offset: 0.05 if offset < 90 else 0.8)
    fill_samples(a[1], DAY + 10.5 * H, 30, utilization=0.5)
    fill_samples(b[0], DAY + 13 * H, 60, utilization=0.0)
    job = make_job(user=people["owner"], team=vision, submitted_at=DAY, state="succeeded")
    make_run(job=job, gpus=b, started_at=dt.datetime(2025, 1, 8, tzinfo=UTC),
             ended_at=dt.datetime(2025, 1, 8, 2, tzinfo=UTC), kind=Run.Kind.BACKFILL)
    return {"r1": r1, "r2": r2, "r3": r3, "r4": r4, "people": people, "gpus": inventory}


# --- figures ----------------------------------------------------------------------------------------
def test_heatmap_booked_vs_used(dataset):
    heatmap = selectors.utilization_heatmap(start=DAY + 9 * H, end=DAY + 15 * H)
    assert [hour.hour for hour in heatmap.hours] == [9, 10, 11, 12, 13, 14]
    rows = {f"{gpu.node.name}/{gpu.index}": index for index, gpu in enumerate(heatmap.gpus)}
    assert heatmap.booked[rows["node-a/0"]] == [0, 1, 1, 0, 0, 0]
    assert heatmap.booked[rows["node-a/1"]] == [0, 0.5, 0, 0, 0, 0]
    assert heatmap.booked[rows["node-a/3"]] == [0] * 6  # cancelled
    assert heatmap.booked[rows["node-b/1"]] == [0, 0, 0, 0, 1, 0]
    assert heatmap.used[rows["node-a/0"]][1:3] == [pytest.approx(0.05), pytest.approx((30 * 0.05 + 30 * 0.8) / 60)]
    assert heatmap.used[rows["node-a/1"]][1] == pytest.approx(0.5)
    assert heatmap.used[rows["node-b/0"]][4] == 0.0
    assert heatmap.used[rows["node-b/1"]] == [None] * 6  # no telemetry is not zero
    assert heatmap.used[rows["node-a/0"]][0] is None


def test_booked_but_idle_by_team_and_user(dataset):
    report = selectors.idle_bookings(user=dataset["people"]["admin"], start=dt.datetime(2025, 1, 1, tzinfo=UTC),
                                     end=NOW, now=NOW, threshold=0.10, share=0.5)
    by_id = {item.reservation.pk: item for item in report.bookings}
    assert list(by_id) == [dataset["r1"].pk, dataset["r3"].pk]  # most wasteful first; R2 was busy
    r1, r3 = by_id[dataset["r1"].pk], by_id[dataset["r3"].pk]
    assert (r1.observed_gpu_minutes, r1.measured_gpu_minutes, r1.idle_gpu_minutes) == (120, 120, 90)
    assert r1.idle_share == 0.75 and r1.wasted_gpu_hours == 1.5
    assert (r3.observed_gpu_minutes, r3.measured_gpu_minutes, r3.idle_gpu_minutes) == (120, 60, 60)
    assert r3.wasted_gpu_hours == 1.0
    ((team, bookings, booked, wasted),) = [(g.team, g.bookings, g.booked_gpu_hours, g.wasted_gpu_hours)
                                           for g in report.by_team]
    assert (team, bookings, booked, wasted) == ("vision", 2, 4.0, 2.5)
    assert [(g.user, g.wasted_gpu_hours) for g in report.by_user] == [("alice", 1.5), ("dave", 1.0)]
    stricter = selectors.idle_bookings(user=dataset["people"]["admin"], start=DAY, end=NOW, now=NOW,
                                       threshold=0.10, share=0.6)
    assert [item.reservation.pk for item in stricter.bookings] == [dataset["r1"].pk]


def test_idle_report_shows_only_the_viewers_teams(dataset):
    people = dataset["people"]
    window = {"start": DAY, "end": NOW, "now": NOW}
    assert selectors.idle_bookings(user=people["outsider"], **window).bookings == []
    assert len(selectors.idle_bookings(user=people["teammate"], **window).bookings) == 2


def test_quota_month_with_backfill_and_forecast(dataset):
    rows = {row.team: row for row in selectors.quota_report(user=dataset["people"]["admin"], now=NOW)}
    vision, nlp = rows["vision"], rows["nlp"]
    assert vision.month == "2025-01" and vision.quota_gpu_hours == 100
    assert vision.reserved_gpu_hours == 2 + 2 + 10 + 1 and vision.reserved_to_date_gpu_hours == 5
    assert vision.backfill_gpu_hours == 2.0  # 2 GPUs × 2 h × 0.5
    assert vision.used_gpu_hours == 17 and vision.remaining_gpu_hours == 83
    # consumed 7 GPU-h in 10 days → 0.7/day × 21 days left = 14.7, more than the 10 booked ahead
    assert vision.forecast_gpu_hours == pytest.approx(7 + 14.7)
    assert nlp.reserved_gpu_hours == 0.5 and nlp.forecast_gpu_hours == pytest.approx(0.5 + 0.05 * 21)
    assert not vision.forecast_over_quota


def test_quota_forecast_prefers_what_is_booked_when_it_is_more(dataset):
    rows = {row.team: row for row in selectors.quota_report(user=dataset["people"]["admin"],
                                                             now=dt.datetime(2025, 1, 3, tzinfo=UTC))}
    # nothing consumed yet by Jan 3; R1–R5 (15 GPU-h) and the backfill run are still ahead
    assert rows["vision"].forecast_gpu_hours == pytest.approx(15.0)


def test_quota_of_past_and_future_months(dataset):
    people = dataset["people"]
    february = {row.team: row for row in selectors.quota_report(user=people["admin"], now=NOW, year=2025, month=2)}
    assert february["vision"].reserved_gpu_hours == 0 and february["vision"].forecast_gpu_hours is None
    later = dt.datetime(2025, 3, 1, tzinfo=UTC)
    january = {row.team: row for row in selectors.quota_report(user=people["admin"], now=later, year=2025, month=1)}
    assert january["vision"].forecast_gpu_hours == 17.0  # a past month forecasts what happened
    assert [row.team for row in selectors.quota_report(user=people["outsider"], now=NOW)] == ["nlp"]


# --- pages, CSV, budgets ------------------------------------------------------------------------
def test_pages_need_a_login(dataset):
    for url in ("/reports/", "/reports/utilization/", "/reports/idle/", "/reports/quota/", "/reports/quota.csv"):
        answer = Client().get(url)
        assert answer.status_code == 302 and "/accounts/login/" in answer["Location"]


def test_utilization_page_and_csv(dataset):
    client = client_for(dataset["people"]["outsider"])
    page = client.get("/reports/utilization/", {"from": "2025-01-07", "to": "2025-01-07"})
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="utilization-heatmap"' in html and "/static/vendor/plotly/4.1.1/plotly.min.js" in html
    assert "cdn.plot.ly" not in html
    answer = client.get("/reports/utilization.csv", {"from": "2025-01-07", "to": "2025-01-07"})
    assert answer["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(answer.content.decode())))
    assert len(rows) == 6 * 24
    row = next(r for r in rows if r["node"] == "node-a" and r["gpu"] == "0" and r["hour_utc"].startswith("2025-01-07T11"))
    assert (row["booked_percent"], row["used_percent"]) == ("100.0", "42.5")


def test_idle_page_and_csv(dataset):
    client = client_for(dataset["people"]["manager"])
    page = client.get("/reports/idle/", {"from": "2025-01-01", "to": "2025-01-10"})
    assert page.status_code == 200
    assert "2.5 GPU-hours" in page.content.decode()
    answer = client.get("/reports/idle.csv", {"from": "2025-01-01", "to": "2025-01-10", "threshold": "10"})
    rows = list(csv.DictReader(io.StringIO(answer.content.decode())))
    assert [(r["reservation"], r["user"], r["idle_gpu_hours"], r["idle_percent"]) for r in rows] == [
        (str(dataset["r1"].pk), "alice", "1.50", "75.0"), (str(dataset["r3"].pk), "dave", "1.00", "50.0")]


def test_quota_page_and_csv(dataset):
    client = client_for(dataset["people"]["admin"])
    assert client.get("/reports/quota/").status_code == 200
    rows = list(csv.DictReader(io.StringIO(client.get("/reports/quota.csv").content.decode())))
    vision = next(r for r in rows if r["team"] == "vision")
    assert vision == {"team": "vision", "month": "2025-01", "time_zone": "UTC", "quota_gpu_hours": "100.00",
                      "reserved_gpu_hours": "15.00", "backfill_gpu_hours": "2.00", "used_gpu_hours": "17.00",
                      "remaining_gpu_hours": "83.00", "forecast_gpu_hours": "21.70"}


def test_bad_parameters_are_explained_not_500(dataset):
    client = client_for(dataset["people"]["owner"])
    for url, params in (("/reports/utilization/", {"from": "yesterday"}), ("/reports/idle/", {"threshold": "300"}),
                        ("/reports/quota/", {"month": "2025-13"}), ("/reports/utilization/", {"from": "2020-01-01"})):
        answer = client.get(url, params)
        assert answer.status_code == 200 and 'role="alert"' in answer.content.decode()


@pytest.mark.parametrize(
    ("url", "params", "budget"),
    [
        # session, user, profile; GPUs (with nodes), bookings, telemetry by GPU and hour
        ("/reports/utilization/", {"from": "2025-01-01", "to": "2025-01-31"}, 6),
        # session, user, profile; reservations (with team, user, node), telemetry by reservation
        ("/reports/idle/", {"from": "2025-01-01", "to": "2025-01-31"}, 5),
        # session, user, profile (the viewer's zone, as every page); teams, bookings, backfill runs
        # (the last two in one round trip on PostgreSQL: config.batch.fetch_together)
        ("/reports/quota/", {}, {"postgresql": 5, "sqlite": 6}),
    ],
)
def test_query_budgets_do_not_grow_with_the_data(dataset, url, params, budget):
    client = client_for(dataset["people"]["admin"])
    with CaptureQueriesContext(connection) as small:
        assert client.get(url, params).status_code == 200
    people = dataset["people"]
    gpus = dataset["gpus"]
    for day in range(12, 20):  # more bookings, telemetry and runs
        start = dt.datetime(2025, 1, day, 8, tzinfo=UTC)
        reservation = make_reservation(user=people["outsider"], team=people["nlp"], gpus=gpus["b"], start=start,
                                       end=start + 2 * H)
        for gpu in gpus["b"]:
            fill_samples(gpu, start, 30, utilization=0.01)
        job = make_job(user=people["outsider"], team=people["nlp"], submitted_at=start, state="succeeded",
                       reservation=reservation)
        make_run(job=job, gpus=gpus["b"], started_at=start, ended_at=start + H, kind=Run.Kind.BACKFILL)
    with CaptureQueriesContext(connection) as large:
        assert client.get(url, params).status_code == 200
    if isinstance(budget, dict):
        budget = budget[connection.vendor]
    assert len(small) == len(large) == budget, [query["sql"][:120] for query in large.captured_queries]
