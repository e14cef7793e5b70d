"""The hourly telemetry roll-up (gpus.models.GpuHourSummary) against the minute buckets it
summarizes: the utilization and idle reports give the figures an independent count over the
raw buckets gives, on generated data with bookings that start and end mid-hour, a report
range that starts at a month edge in a half-hour zone, a `now` in the middle of an hour, gaps
and unread minutes; the roll-up is idempotent, follows a retried minute, and outlives the
archiving of the buckets it came from."""

import datetime as dt
import random
import zoneinfo

import pytest
from django.core.files.storage import FileSystemStorage

from gpus.models import GpuHourSummary, GpuSample
from gpus.telemetry.store import BUCKET_FIELDS, hour_summaries_refresh, samples_record
from reports import selectors
from reservations.models import Reservation
from tests.factories import fill_samples, make_reservation
from training.logs import logs_archive

UTC = dt.UTC
MIN = dt.timedelta(minutes=1)
H = dt.timedelta(hours=1)
ZONE = zoneinfo.ZoneInfo("Asia/Kolkata")  # UTC+5:30: the viewer's month starts at 18:30 UTC
START = dt.datetime(2025, 2, 1, tzinfo=ZONE).astimezone(UTC)
END = dt.datetime(2025, 2, 3, tzinfo=ZONE).astimezone(UTC)
NOW = dt.datetime(2025, 2, 1, 23, 37, tzinfo=UTC)  # mid-hour, inside the range
GRID_VALUES = [k / 100 for k in range(0, 101, 5)]  # values exactly on the thresholds, too


def _bucket(gpu, minute, utilization):
    return {**dict.fromkeys(BUCKET_FIELDS), "minute": minute, "index": gpu.index, "uuid": gpu.uuid or "",
            "sample_count": 12, "utilization_mean": utilization}


def _generate(seed, inventory, people):
    rng = random.Random(seed)
    gpus = inventory["a"] + inventory["b"]
    for node_gpus in (inventory["a"], inventory["b"]):
        buckets = []
        minute = START - 2 * H
        while minute < NOW:
            for gpu in node_gpus:
                roll = rng.random()
                if roll < 0.1:
                    continue  # no bucket that minute
                value = None if roll < 0.15 else rng.choice(GRID_VALUES) if roll < 0.5 else rng.random()
                buckets.append(_bucket(gpu, minute, value))
            minute += MIN
        # In a few posts, as agents send them, so hours are refreshed more than once.
        for begin in range(0, len(buckets), 997):
            samples_record(node=node_gpus[0].node, buckets=buckets[begin:begin + 997], now=NOW)
    free = {gpu.pk: START - 90 * MIN for gpu in gpus}  # a GPU's bookings never overlap
    for _ in range(16):
        node_gpus = rng.choice([inventory["a"], inventory["b"]])
        booked = rng.sample(node_gpus, rng.randint(1, 2))
        start = max(free[gpu.pk] for gpu in booked) + rng.randint(0, 300) * MIN
        if start > NOW:
            continue
        status = rng.choice([Reservation.Status.COMPLETED, Reservation.Status.ACTIVE, Reservation.Status.RELEASED])
        end = start + rng.randint(1, 400) * MIN
        make_reservation(user=people["owner"], team=people["vision"], gpus=booked, start=start, end=end,
                         status=status)
        free.update(dict.fromkeys((gpu.pk for gpu in booked), end))
    return gpus


def _raw_idle(threshold):
    """reservation id → (measured, idle) GPU-minutes counted over the minute buckets."""
    candidates = list(Reservation.objects.filter(
        status__in=(Reservation.Status.ACTIVE, Reservation.Status.COMPLETED, Reservation.Status.RELEASED),
        start__gte=START, start__lt=min(END, NOW)).prefetch_related("booked"))
    until = min(NOW, max(reservation.end for reservation in candidates))
    samples = [(s.gpu_id, s.minute, s.utilization_mean) for s in GpuSample.objects.all()]
    figures = {}
    for reservation in candidates:
        measured = idle = 0
        for row in reservation.booked.all():
            for gpu_id, minute, value in samples:
                if (gpu_id == row.gpu_id and max(row.start, START) <= minute < min(row.end, until)
                        and value is not None):
                    measured += 1
                    idle += value < threshold
        figures[reservation.pk] = (measured, idle)
    return figures


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_reports_from_the_roll_up_equal_the_raw_counts(inventory, people, seed):
    gpus = _generate(seed, inventory, people)
    for threshold in (0.10, 0.05, 0.5, 1.0, 0.07):  # on the 5 % grid, and off it (0.07)
        report = selectors.idle_bookings(user=people["admin"], start=START, end=END, now=NOW,
                                         threshold=threshold, share=0.0)  # share 0: every booking observed
        expected = _raw_idle(threshold)
        got = {item.reservation.pk: (item.measured_gpu_minutes, item.idle_gpu_minutes) for item in report.bookings}
        assert got == {pk: figures for pk, figures in expected.items() if pk in got}, threshold
        assert set(got) <= set(expected) and len(got) >= 3
        assert any(measured > idle > 0 for measured, idle in got.values())  # the test can tell them apart

    heatmap = selectors.utilization_heatmap(start=START, end=END)
    by_hour = {}
    for sample in GpuSample.objects.filter(utilization_mean__isnull=False):
        by_hour.setdefault((sample.gpu_id, sample.minute.replace(minute=0)), []).append(sample.utilization_mean)
    for row, gpu in enumerate(heatmap.gpus):
        for column, hour in enumerate(heatmap.hours):
            values = by_hour.get((gpu.pk, hour))
            assert heatmap.used[row][column] == (None if not values else pytest.approx(sum(values) / len(values)))
    assert {gpu.pk for gpu in gpus} == {gpu.pk for gpu in heatmap.gpus}


def test_roll_up_is_idempotent_and_follows_a_retried_minute(inventory):
    gpu = inventory["a"][0]
    hour = dt.datetime(2025, 1, 7, 10, tzinfo=UTC)
    fill_samples(gpu, hour - 30 * MIN, 90, utilization=lambda offset: 0.02 if offset % 3 else 0.6)

    def rows():
        return list(GpuHourSummary.objects.order_by("gpu", "hour").values())

    first = rows()
    assert [(row["hour"], row["samples"]) for row in first] == [(hour - H, 30), (hour, 60)]
    assert hour_summaries_refresh() == 2
    assert hour_summaries_refresh(gpu_ids=[gpu.pk], start=hour, end=hour + MIN) == 1
    assert rows() == first
    # An agent that retries a post replaces the minute; the hour follows, counted once.
    samples_record(node=gpu.node, buckets=[_bucket(gpu, hour + 5 * MIN, 0.9)], now=hour + H)
    summary = GpuHourSummary.objects.get(gpu=gpu, hour=hour)
    stored = list(GpuSample.objects.filter(gpu=gpu, minute__gte=hour).values_list("utilization_mean", flat=True))
    assert summary.samples == 60 and summary.sum_utilization == pytest.approx(sum(stored))
    assert summary.under_10 == sum(value < 0.10 for value in stored) == 39


def test_archiving_the_buckets_keeps_the_whole_hours_of_the_reports(inventory, people, tmp_path):
    gpu = inventory["a"][0]
    day = dt.datetime(2025, 1, 7, tzinfo=UTC)
    fill_samples(gpu, day + 10 * H, 120, utilization=lambda offset: 0.05 if offset < 90 else 0.8)
    make_reservation(user=people["owner"], team=people["vision"], gpus=[gpu], start=day + 10 * H,
                     end=day + 12 * H)
    now = day + dt.timedelta(days=100)

    def figures():
        heatmap = selectors.utilization_heatmap(start=day, end=day + dt.timedelta(days=1))
        idle = selectors.idle_bookings(user=people["admin"], start=day, end=day + dt.timedelta(days=1), now=now)
        return heatmap.used[heatmap.gpus.index(gpu)], [(b.measured_gpu_minutes, b.idle_gpu_minutes)
                                                        for b in idle.bookings]

    before = figures()
    assert before[1] == [(120, 90)]
    logs_archive(now=now, days=90, storage=FileSystemStorage(location=tmp_path))
    assert not GpuSample.objects.exists()
    assert figures() == before


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_posts_in_flight_for_one_hour_both_count(postgres_only, inventory):
    """A post waits for the node's post in flight: computed side by side, each roll-up of the
    hour would miss the other's minute and the later would win."""
    import threading
    import time

    from django.db import connection, connections, transaction

    gpu = inventory["a"][0]
    hour = dt.datetime(2025, 1, 7, 10, tzinfo=UTC)
    posted, release, errors = threading.Event(), threading.Event(), []

    def post(minute, *, hold):
        try:
            with transaction.atomic():  # held open: the first post has not committed yet
                samples_record(node=gpu.node, buckets=[_bucket(gpu, minute, 0.02)], now=hour + H)
                if hold:
                    posted.set()
                    assert release.wait(20)
        except Exception as error:  # reported by the main thread
            errors.append(error)
        finally:
            connections.close_all()

    first = threading.Thread(target=post, args=(hour,), kwargs={"hold": True})
    first.start()
    assert posted.wait(20)
    second = threading.Thread(target=post, args=(hour + MIN,), kwargs={"hold": False})
    second.start()
    deadline = time.monotonic() + 10
    with connection.cursor() as cursor:
        while True:  # until the second post waits on a lock held by the first
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
            if cursor.fetchone()[0]:
                break
            assert time.monotonic() < deadline, "the second post never waited"
            time.sleep(0.02)
    release.set()
    first.join(20)
    second.join(20)
    assert not errors and not first.is_alive() and not second.is_alive()
    summary = GpuHourSummary.objects.get(gpu=gpu, hour=hour)
    assert (summary.samples, summary.under_10) == (2, 2)
