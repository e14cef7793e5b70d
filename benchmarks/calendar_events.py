"""Benchmark: the calendar's events feed for 64 GPUs × 7 days × 2,000 bookings.

Run from the repository root:  .venv/bin/python benchmarks/calendar_events.py
It creates its own database (DATABASE_URL, default
postgres://postgres@127.0.0.1:5432/gpubook_bench_calendar), migrates it, bulk-creates the
fixture (no two bookings of one GPU overlap: PostgreSQL's exclusion constraint checks that),
measures, and drops the database again.

Figures printed:
- the whole request (`GET /calendar/events.json`: session, auth, profile, feed, JSON) through
  Django's test client — median, p95 and its query count (goal: ≤ 100 ms median, ≤ 10 queries);
- the feed builder alone;
- baselines: the same feed built the naive way (per-row lookups of team, user and GPUs: the
  "N+1" version) and the raw SQL fetch of the rows the feed needs (a floor nothing beats).
"""

import datetime as dt
import os
import pathlib
import statistics
import sys
import time
import zoneinfo

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/gpubook_bench_calendar"
os.environ.setdefault("DATABASE_URL", DEFAULT_URL)
os.environ.setdefault("SECRET_KEY", "gpubook-benchmark-only")
os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

GPUS_PER_NODE, NODES, BOOKINGS, DAYS = 8, 8, 2000, 7
RUNS, BASELINE_RUNS = 60, 5


def _postgres_admin(url: str):
    import psycopg

    base, name = url.rsplit("/", 1)
    return psycopg.connect(base + "/postgres", autocommit=True), name


def create_database(url: str) -> None:
    if url.startswith("sqlite:///"):
        pathlib.Path(url.removeprefix("sqlite:///")).unlink(missing_ok=True)
        return
    if not url.startswith("postgres"):
        return
    connection, name = _postgres_admin(url)
    with connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}"')
        connection.execute(f'CREATE DATABASE "{name}"')


def drop_database(url: str) -> None:
    if url.startswith("sqlite:///"):
        pathlib.Path(url.removeprefix("sqlite:///")).unlink(missing_ok=True)
        return
    if not url.startswith("postgres"):
        return
    connection, name = _postgres_admin(url)
    with connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def build_fixture(week_start: dt.datetime) -> dict:
    from django.contrib.auth import get_user_model

    from gpus.models import Gpu, MaintenanceWindow, Node
    from reservations.models import Membership, Reservation, ReservationGpu, Team, UserProfile

    users = get_user_model()
    vision = Team.objects.create(name="vision", slug="vision", monthly_gpu_hours=100_000)
    nlp = Team.objects.create(name="nlp", slug="nlp", monthly_gpu_hours=100_000)
    alice = users.objects.create(username="alice")
    carol = users.objects.create(username="carol")
    Membership.objects.create(user=alice, team=vision)
    Membership.objects.create(user=carol, team=nlp)
    UserProfile.objects.create(user=alice, time_zone="Europe/Berlin")
    nodes = Node.objects.bulk_create(Node(name=f"node-{n:02d}") for n in range(NODES))
    Gpu.objects.bulk_create(
        Gpu(node=node, index=i, model_name="NVIDIA H100", memory_mib=81559)
        for node in nodes
        for i in range(GPUS_PER_NODE)
    )
    gpus = list(Gpu.objects.order_by("node__name", "index"))
    # GPU g gets a booking every 5 hours, 2–4 h long, 0–60 min into its step: ≈ 31 per GPU
    # across the 7 days and never two at once.
    reservations, booked_gpus = [], []
    for number in range(BOOKINGS):
        gpu = gpus[number % len(gpus)]
        start = week_start + dt.timedelta(minutes=300 * (number // len(gpus)) + 30 * (number % len(gpus) % 3))
        end = start + dt.timedelta(minutes=120 + 30 * (number % 5))
        mine = number % 2 == 0
        reservations.append(
            Reservation(
                user=alice if mine else carol, team=vision if mine else nlp, node_id=gpu.node_id, gpu_count=1,
                start=start, end=end, created_at=start, updated_at=start, note=f"run {number}",
            )
        )
        booked_gpus.append(gpu)
    created = Reservation.objects.bulk_create(reservations)
    ReservationGpu.objects.bulk_create(
        ReservationGpu(reservation=r, gpu=gpu, start=r.start, end=r.end)
        for r, gpu in zip(created, booked_gpus, strict=True)
    )
    window = MaintenanceWindow.objects.create(
        node=nodes[0], start=week_start, end=week_start + dt.timedelta(hours=2), reason="firmware"
    )
    window.gpus.add(gpus[0])
    return {"alice": alice}


def naive_feed(*, user, start, end, tz) -> dict:
    """The feed as it is easy to write: walk reservations, follow each relation per row."""
    from gpus.models import Gpu, MaintenanceWindow
    from reservations.calendar_feed import floating
    from reservations.models import Membership, Reservation

    team_ids = set(Membership.objects.filter(user=user).values_list("team_id", flat=True))
    resources = [{"id": str(gpu.pk), "title": f"{gpu.node.name} GPU {gpu.index}"} for gpu in Gpu.objects.all()]
    events = []
    for reservation in Reservation.objects.filter(
        status__in=Reservation.OCCUPYING, start__lt=end, end__gt=start
    ).order_by("start"):
        visible = reservation.team_id in team_ids
        events.append(
            {
                "id": f"r{reservation.pk}",
                "resourceIds": [str(gpu.pk) for gpu in reservation.gpus.all()],
                "start": floating(reservation.start, tz),
                "end": floating(reservation.end, tz),
                "title": f"{reservation.user.username} · {reservation.team.name}" if visible else reservation.team.name,
            }
        )
    for window in MaintenanceWindow.objects.filter(start__lt=end, end__gt=start):
        events.append({"id": f"m{window.pk}", "resourceIds": [str(g.pk) for g in window.gpus.all()],
                       "start": floating(window.start, tz), "end": floating(window.end, tz), "title": window.reason})
    return {"resources": resources, "events": events}


def timed(function, runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        began = time.perf_counter()
        function()
        samples.append((time.perf_counter() - began) * 1000)
    return samples


def p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main() -> int:
    url = os.environ["DATABASE_URL"]
    create_database(url)
    try:
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection
        from django.test import Client
        from django.test.utils import CaptureQueriesContext

        from reservations import calendar_feed as feed_module
        from reservations.calendar_feed import calendar_feed

        call_command("migrate", verbosity=0)
        week_start = dt.datetime(2030, 3, 4, tzinfo=dt.UTC)
        fixture = build_fixture(week_start)
        week_end = week_start + dt.timedelta(days=DAYS)
        tz = zoneinfo.ZoneInfo("Europe/Berlin")
        client = Client(SERVER_NAME="localhost")
        client.force_login(fixture["alice"])
        params = {"start": week_start.isoformat(), "end": week_end.isoformat()}

        def request():
            response = client.get("/calendar/events.json", params)
            assert response.status_code == 200, response.status_code

        timed(request, 5)  # warm up: connection, caches, code paths
        with CaptureQueriesContext(connection) as captured:
            response = client.get("/calendar/events.json", params)
        events = response.json()["events"]
        bookings = sum(1 for event in events if event["extendedProps"]["kind"] in ("booking", "busy"))
        request_ms = timed(request, RUNS)
        feed_ms = timed(
            lambda: calendar_feed(user=fixture["alice"], start=week_start, end=week_end, tz=tz, now=week_start), RUNS
        )
        # The same builder without the other apps' booking details (training's job of each booking).
        providers = list(feed_module.booking_details)
        feed_module.booking_details.clear()
        bare_ms = timed(
            lambda: calendar_feed(user=fixture["alice"], start=week_start, end=week_end, tz=tz, now=week_start), RUNS
        )
        feed_module.booking_details.extend(providers)

        with CaptureQueriesContext(connection) as naive_captured:
            naive_feed(user=fixture["alice"], start=week_start, end=week_end, tz=tz)
        naive_ms = timed(
            lambda: naive_feed(user=fixture["alice"], start=week_start, end=week_end, tz=tz), BASELINE_RUNS
        )

        # The rows the feed reads, fetched with no ORM at all (times as wall-clock text on
        # PostgreSQL, as the feed fetches them).
        if connection.vendor == "postgresql":
            times = """to_char(r.start AT TIME ZONE 'Europe/Berlin', 'YYYY-MM-DD"T"HH24:MI:SS'),
                       to_char(r."end" AT TIME ZONE 'Europe/Berlin', 'YYYY-MM-DD"T"HH24:MI:SS')"""
        else:
            times = 'r.start, r."end"'
        raw_sql = f"""
            SELECT rg.reservation_id, rg.gpu_id, {times}, r.status, r.team_id, t.name, r.user_id,
                   u.username, r.note
            FROM reservations_reservationgpu rg
            JOIN reservations_reservation r ON r.id = rg.reservation_id
            JOIN reservations_team t ON t.id = r.team_id
            JOIN auth_user u ON u.id = r.user_id
            WHERE rg.occupies AND rg.start < %s AND rg."end" > %s
            ORDER BY r.start, rg.reservation_id, rg.gpu_id
        """  # noqa: S608 — `times` is one of two constants above

        def raw_fetch():
            with connection.cursor() as cursor:
                cursor.execute(raw_sql, [week_end, week_start])
                cursor.fetchall()

        raw_ms = timed(raw_fetch, RUNS)

        median_request = statistics.median(request_ms)
        print(f"calendar events feed — {NODES * GPUS_PER_NODE} GPUs × {DAYS} days × {bookings} bookings "
              f"({connection.vendor})")
        print(f"  GET /calendar/events.json  median {median_request:7.1f} ms   p95 {p95(request_ms):7.1f} ms   "
              f"queries {len(captured)}   response {len(response.content) / 1024:.0f} KiB")
        print(f"  feed builder alone         median {statistics.median(feed_ms):7.1f} ms   p95 {p95(feed_ms):7.1f} ms")
        print(f"  … without job labels       median {statistics.median(bare_ms):7.1f} ms   p95 {p95(bare_ms):7.1f} ms")
        print(f"  baseline: naive N+1 feed   median {statistics.median(naive_ms):7.1f} ms   "
              f"p95 {p95(naive_ms):7.1f} ms   queries {len(naive_captured)}")
        print(f"  floor: raw SQL fetch       median {statistics.median(raw_ms):7.1f} ms   (same rows, no ORM)")
        print(f"  ratio: naive / request = {statistics.median(naive_ms) / median_request:.0f}× ; "
              f"request / raw SQL floor = {median_request / statistics.median(raw_ms):.1f}×")
        goal_met = median_request <= 100 and len(captured) <= 10
        print(f"  goal (≤ 100 ms median, ≤ 10 queries): {'met' if goal_met else 'NOT met'}")
        connection.close()
        return 0 if goal_met else 1
    finally:
        drop_database(url)


if __name__ == "__main__":
    sys.exit(main())
