"""The reports at a month of a 64-GPU cluster (issue #19 item 3), on PostgreSQL.

    .venv/bin/python benchmarks/reports.py [--gpus 64] [--days 30] [--repeat 5]

Builds 64 GPUs (8 nodes × 8), 8 teams, a booking on every GPU most hours of 30 days (made
through `reservation_create`, the clock set before each slot) and a GPU-minute of telemetry
for every GPU and minute of those days (2.8 million rows, written in one INSERT … SELECT over
generate_series: history, as the telemetry collector would have left it, with its hourly
roll-up). Then each report
page is requested by an admin through the whole Django stack, in this process:
`/reports/utilization/`, `/reports/idle/`, `/reports/quota/` for the 30 days — median server
time and statements (goal <= 500 ms each, statements not growing with the data: the same
page on the first day alone is the baseline, measured in the same run). Last, what keeping
the hourly roll-up costs a telemetry post.
Uses its own database (gpubook_bench_reports), dropped and recreated.
"""

import argparse
import datetime as dt
import statistics
import sys
import time

from _support import SERVER, django_on, fresh_database

DATABASE = "gpubook_bench_reports"
# A month that has passed (the report pages read the real clock), far enough back for 30 days.
FIRST_DAY = dt.date.today() - dt.timedelta(days=45)
H = dt.timedelta(hours=1)


def build(gpu_count: int, days: int) -> None:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.utils import timezone

    from gpus.models import Gpu, Node
    from gpus.telemetry.store import hour_summaries_refresh
    from reservations.models import Membership, Team
    from reservations.services import reservation_create, reservations_advance

    began = time.perf_counter()
    nodes = [Node.objects.create(name=f"node-{number}") for number in range(gpu_count // 8)]
    gpus = Gpu.objects.bulk_create(
        Gpu(node=node, index=index, model_name="A100", memory_mib=81920) for node in nodes for index in range(8)
    )
    teams = [Team.objects.create(name=f"team{n}", slug=f"team{n}", monthly_gpu_hours=10**6, max_days_ahead=3650)
             for n in range(8)]
    people = []
    for team in teams:
        user = get_user_model().objects.create_user(username=f"{team.slug}-lead")
        Membership.objects.create(team=team, user=user)
        people.append((user, team))
    get_user_model().objects.create_superuser(username="admin", password="admin-password-1")
    start_of = dt.datetime.combine(FIRST_DAY, dt.time(), tzinfo=dt.UTC)
    bookings = 0
    for day in range(days):
        for gpu_number, gpu in enumerate(gpus):
            # Two 8-hour bookings a day per GPU, one of every four left idle in the telemetry.
            for shift in (0, 12):
                start = start_of + dt.timedelta(days=day) + (shift + gpu_number % 4) * H
                user, team = people[(gpu_number + day) % len(people)]
                reservation_create(user=user, team=team, gpu_ids=[gpu.pk], start=start, end=start + 8 * H,
                                   now=start - H)
                bookings += 1
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO gpus_gpusample (gpu_id, minute, sample_count, utilization_mean, utilization_max,"
            " temperature_celsius_mean, power_watts_mean)"
            " SELECT gpu.id, minute, 12, CASE WHEN gpu.id %% 4 = 0 THEN 0.02 ELSE 0.85 END, 0.9, 60, 300"
            " FROM gpus_gpu AS gpu,"
            " generate_series(%s::timestamptz, %s::timestamptz - interval '1 minute', interval '1 minute') AS minute",
            [start_of, start_of + dt.timedelta(days=days)],
        )
    # The hourly roll-up that samples_record keeps as the buckets arrive (issue #19).
    hour_summaries_refresh()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    reservations_advance(now=timezone.now())  # what the ticks would have done: the past bookings completed
    print(f"built: {len(gpus)} GPUs, {bookings} bookings, {len(gpus) * days * 1440:,} telemetry minutes "
          f"in {time.perf_counter() - began:.0f} s")


def measure(client, url: str, params: dict, repeat: int) -> tuple[float, int]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    times = []
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as captured:
            began = time.perf_counter()
            response = client.get(url, params)
            times.append(time.perf_counter() - began)
        assert response.status_code == 200, response.status_code
    return statistics.median(times), len(captured.captured_queries)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--database", default=DATABASE, help="its own database, dropped and recreated")
    parser.add_argument("--reuse", action="store_true", help="measure the database the last run built")
    args = parser.parse_args(argv)
    if not args.reuse:
        fresh_database(args.database)
    # Plain static storage: these pages are measured in this process, without collectstatic.
    django_on(f"{SERVER}/{args.database}", GPUBOOK_NOTIFY_ENQUEUE="false", ALLOWED_HOSTS="testserver",
              GPUBOOK_STATIC_MANIFEST="false")
    if not args.reuse:
        build(args.gpus, args.days)

    from django.test import Client

    client = Client()
    assert client.login(username="admin", password="admin-password-1")
    last_day = FIRST_DAY + dt.timedelta(days=args.days - 1)
    month = {"from": FIRST_DAY.isoformat(), "to": last_day.isoformat()}
    one_day = {"from": FIRST_DAY.isoformat(), "to": FIRST_DAY.isoformat()}
    empty_month = {"month": (FIRST_DAY - dt.timedelta(days=40)).strftime("%Y-%m")}
    pages = [
        ("utilization", "/reports/utilization/", month, one_day),
        ("idle", "/reports/idle/", month, one_day),
        ("quota", "/reports/quota/", {"month": FIRST_DAY.strftime("%Y-%m")}, empty_month),
    ]
    failed = False
    for name, url, params, baseline_params in pages:
        small_time, small_queries = measure(client, url, baseline_params, args.repeat)
        big_time, big_queries = measure(client, url, params, args.repeat)
        verdict = "met" if big_time <= 0.5 and big_queries == small_queries else "NOT met"
        failed |= verdict != "met"
        print(f"{name:>11}: {args.days} days {big_time * 1000:.0f} ms, {big_queries} statements; "
              f"baseline (one day / an empty month) {small_time * 1000:.0f} ms, {small_queries} statements "
              f"(goal <= 500 ms, same statements: {verdict})")
    measure_ingest(last_day + dt.timedelta(days=1))
    return 1 if failed else 0


def measure_ingest(day: dt.date, minutes: int = 60) -> None:
    """What keeping the roll-up costs where telemetry arrives: one node's post of 8 GPUs × 1
    minute through samples_record, and the roll-up refresh inside it alone (its share)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from gpus.models import GpuHourSummary, GpuSample, Node
    from gpus.telemetry.store import BUCKET_FIELDS, hour_summaries_refresh, samples_record

    node = Node.objects.order_by("name").first()
    gpu_ids = list(node.gpus.values_list("pk", flat=True))
    first = dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)
    whole, refresh = [], []
    for number in range(minutes):
        minute = first + dt.timedelta(minutes=number)
        buckets = [{**dict.fromkeys(BUCKET_FIELDS), "minute": minute, "index": index, "uuid": "",
                    "sample_count": 12, "utilization_mean": 0.5} for index in range(len(gpu_ids))]
        with CaptureQueriesContext(connection) as captured:
            began = time.perf_counter()
            samples_record(node=node, buckets=buckets, now=minute)
            whole.append(time.perf_counter() - began)
        began = time.perf_counter()
        hour_summaries_refresh(gpu_ids=gpu_ids, start=minute, end=minute + dt.timedelta(minutes=1))
        refresh.append(time.perf_counter() - began)
    GpuSample.objects.filter(minute__gte=first).delete()
    GpuHourSummary.objects.filter(hour__gte=first).delete()
    print(f"     ingest: {len(gpu_ids)} GPUs × 1 minute through samples_record "
          f"{statistics.median(whole) * 1000:.1f} ms, "
          f"{len(captured.captured_queries)} statements; the roll-up refresh in it "
          f"{statistics.median(refresh) * 1000:.1f} ms, 2 statements")


if __name__ == "__main__":
    sys.exit(main())
