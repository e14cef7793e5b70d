"""The watchdog tick by tick with an injected `now`: idle bookings (notice, release and
refund) and anomaly stops (NaN or jumping loss, hot GPU)."""

import datetime as dt

import pytest

from gpus.models import GpuSample
from reservations import selectors
from reservations.models import Reservation
from tests.factories import fill_samples, make_job, make_reservation, make_run
from training import reconcile, watchdog
from training.models import Run, RunMetric
from training.watchdog import watchdog_tick

MIN = dt.timedelta(minutes=1)
H = dt.timedelta(hours=1)
START = dt.datetime(2025, 3, 10, 9, 0, tzinfo=dt.UTC)


@pytest.fixture
def notices(monkeypatch):
    """Record the watchdog's own notices at its one call site."""
    sent = []

    def emit(**kwargs):
        sent.append(kwargs)
        return True

    monkeypatch.setattr(watchdog, "_emit", emit)
    return sent


@pytest.fixture
def booking(inventory, people, settings):
    settings.GPUBOOK_SLOT_MINUTES = 30
    team = people["vision"]
    team.idle_release, team.idle_threshold_percent, team.idle_minutes = True, 10, 30
    team.save()
    gpus = inventory["a"][:2]
    reservation = make_reservation(user=people["owner"], team=team, gpus=gpus, start=START, end=START + 3 * H,
                                   status=Reservation.Status.ACTIVE)
    return {"reservation": reservation, "gpus": gpus, "team": team, "people": people}


def test_an_idle_booking_is_released_from_the_next_slot_edge_and_refunded(booking, notices):
    reservation, gpus = booking["reservation"], booking["gpus"]
    for gpu in gpus:
        fill_samples(gpu, START, 40, utilization=0.03)
    team_usage = selectors.usage_seconds(team=booking["team"], window_start=START, window_end=START + 4 * H)
    assert team_usage == 2 * 3 * 3600

    # tick by tick: 29 full minutes of idleness are not 30
    assert watchdog_tick(now=START + 29 * MIN + 30 * dt.timedelta(seconds=1)).idle == []
    summary = watchdog_tick(now=START + 30 * MIN + 5 * dt.timedelta(seconds=1))
    assert summary.idle == [reservation.pk] and summary.released == [reservation.pk]
    reservation.refresh_from_db()
    assert reservation.status == Reservation.Status.RELEASED
    assert reservation.end == START + H  # the current slot is kept, the rest given back
    assert "under 10 % utilization for 30 minutes" in reservation.release_reason
    assert set(reservation.booked.values_list("end", flat=True)) == {START + H}  # bookable again
    assert selectors.usage_seconds(team=booking["team"], window_start=START, window_end=START + 4 * H) == 2 * 3600
    assert notices == []  # the release notice (reservation_release) tells the owner
    # the next tick finds nothing to do
    later = watchdog_tick(now=START + 31 * MIN)
    assert later.idle == [] and later.released == []


def test_one_busy_minute_on_one_gpu_keeps_the_booking(booking, notices):
    gpus = booking["gpus"]
    fill_samples(gpus[0], START, 60, utilization=0.03)
    fill_samples(gpus[1], START, 60, utilization=lambda offset: 0.5 if offset == 20 else 0.0)
    assert watchdog_tick(now=START + 30 * MIN).idle == []
    assert watchdog_tick(now=START + 50 * MIN).idle == []  # window 20–50 still holds minute 20
    assert watchdog_tick(now=START + 51 * MIN).idle == [booking["reservation"].pk]


def test_missing_telemetry_is_never_read_as_idle(booking, notices):
    gpus = booking["gpus"]
    fill_samples(gpus[0], START, 30, utilization=0.0)
    fill_samples(gpus[1], START, 20, utilization=0.0)  # 50 of 60 GPU-minutes: under 90 % coverage
    summary = watchdog_tick(now=START + 30 * MIN)
    assert summary.idle == [] and notices == []


def test_without_idle_release_the_owner_is_told_once_and_the_booking_stays(booking, notices):
    booking["team"].idle_release = False
    booking["team"].save()
    for gpu in booking["gpus"]:
        fill_samples(gpu, START, 60, utilization=0.0)
    summary = watchdog_tick(now=START + 30 * MIN)
    assert summary.notified == [booking["reservation"].pk] and summary.released == []
    (notice,) = notices
    assert notice["event_type"] == "reservation.idle" and notice["user_id"] == booking["people"]["owner"].pk
    assert notice["dedupe_key"] == f"reservation:{booking['reservation'].pk}:idle"
    assert "under 10 % utilization for 30 minutes" in notice["payload"]["reason"]
    booking["reservation"].refresh_from_db()
    assert booking["reservation"].status == Reservation.Status.ACTIVE


def test_a_booking_with_a_live_run_is_not_released(booking, notices):
    people = booking["people"]
    job = make_job(user=people["owner"], team=booking["team"], submitted_at=START - H,
                   reservation=booking["reservation"], state="running")
    make_run(job=job, gpus=booking["gpus"], started_at=START, reservation=booking["reservation"])
    for gpu in booking["gpus"]:
        fill_samples(gpu, START, 40, utilization=0.0)
    summary = watchdog_tick(now=START + 30 * MIN)
    assert summary.released == [] and summary.notified == [booking["reservation"].pk]
    assert "still live" in notices[0]["payload"]["reason"]


def test_the_last_slot_is_not_released_for_nothing(booking, notices):
    for gpu in booking["gpus"]:
        fill_samples(gpu, START, 180, utilization=0.0)
    summary = watchdog_tick(now=START + 2 * H + 40 * MIN)  # the next edge is the booking's end
    assert summary.released == [] and summary.notified == [booking["reservation"].pk]


# --- anomalies -----------------------------------------------------------------------------------
@pytest.fixture
def running(inventory, people, settings):
    settings.GPUBOOK_STOP_GRACE_SECONDS = 60
    settings.GPUBOOK_ANOMALY_TEMPERATURE_CELSIUS = 90
    settings.GPUBOOK_ANOMALY_LOSS_JUMP_FACTOR = 3.0
    settings.GPUBOOK_ANOMALY_LOSS_WINDOW = 5
    job = make_job(user=people["owner"], team=people["vision"], submitted_at=START - H, state="running")
    run = make_run(job=job, gpus=inventory["b"], started_at=START, kind=Run.Kind.BACKFILL,
                   must_end_by=START + 10 * H)
    # As the local executor's start() would have returned it (reconcile stores it).
    run.handle = {"run_id": run.pk, "name": f"gpubook-run-{run.pk}", "executor": "local", "namespace": None, "uid": None}
    run.save(update_fields=["handle"])
    return run


def epoch(run, number, **losses):
    RunMetric.objects.create(run=run, event="epoch", epoch=number, at=START + number * MIN,
                             values={"mAP50": 0.1 * number, "val_box_loss": 9.0, **losses})


def test_a_loss_jump_stops_the_run_with_a_checkpoint_and_says_why(running, notices):
    for number, loss in enumerate([1.2, 1.0, 0.9, 0.85], start=1):
        epoch(running, number, box_loss=loss, cls_loss=0.5)
        assert watchdog_tick(now=START + number * MIN).stopped == {}
    epoch(running, 5, box_loss=2.8, cls_loss=0.5)  # under 3 × the median of 1.2, 1.0, 0.9, 0.85 (0.95)
    assert watchdog_tick(now=START + 5 * MIN).stopped == {}
    epoch(running, 6, box_loss=3.1, cls_loss=0.5)
    now = START + 6 * MIN
    summary = watchdog_tick(now=now)
    assert list(summary.stopped) == [running.pk]
    running.refresh_from_db()
    assert running.state == Run.State.STOPPING
    assert running.stop_requested_at == now and running.kill_at == now + dt.timedelta(seconds=60)
    assert "box_loss jumped to 3.1" in running.reason and "median of the previous 5 epochs" in running.reason
    (notice,) = notices
    assert notice["event_type"] == "run.anomaly" and notice["payload"]["reason"] == running.reason
    running.job.refresh_from_db()
    assert running.job.state == "failed" and running.job.reason.startswith("Held after an anomaly")
    # level-triggered: a second tick does nothing more
    assert watchdog_tick(now=now + MIN).stopped == {}
    assert len(notices) == 1


def test_the_stop_is_delivered_by_reconcile_repair(running, notices):
    epoch(running, 1, box_loss="nan")
    watchdog_tick(now=START + MIN)

    class Executor:
        kind = "local"
        stops = []

        def stop(self, handle, grace):
            self.stops.append((handle.run_id, grace))

    executor = Executor()
    reconcile.repair(executor=executor, now=START + MIN + dt.timedelta(seconds=20), report=reconcile.TickReport())
    assert executor.stops == [(running.pk, 40)]


def test_a_nan_loss_in_the_live_progress_stops_the_run(running, notices):
    epoch(running, 1, box_loss=1.0)
    Run.objects.filter(pk=running.pk).update(progress={"event": "batch", "epoch": 2, "box_loss": "nan"})
    summary = watchdog_tick(now=START + 2 * MIN)
    assert "box_loss became nan" in summary.stopped[running.pk]


def test_a_loss_the_runner_stopped_reporting_counts_as_non_finite(running, notices):
    epoch(running, 1, box_loss=1.0, cls_loss=0.5)
    epoch(running, 2, cls_loss=0.5)  # the runner drops NaN values from its reports
    summary = watchdog_tick(now=START + 3 * MIN)
    assert "box_loss became NaN or infinite" in summary.stopped[running.pk]


def test_validation_losses_and_short_histories_do_not_trigger(running, notices):
    epoch(running, 1, box_loss=1.0)
    epoch(running, 2, box_loss=5.0)  # a jump, but two epochs are no "recent level"
    epoch(running, 3, box_loss=1.0, val_box_loss="nan")
    assert watchdog_tick(now=START + 4 * MIN).stopped == {}


def test_a_hot_gpu_stops_the_run(running, inventory, notices):
    now = START + 20 * MIN
    fill_samples(inventory["b"][0], now - 5 * MIN, 5, temperature=84.0, utilization=0.9)
    fill_samples(inventory["b"][1], now - 5 * MIN, 4, temperature=85.0, utilization=0.9)
    assert watchdog_tick(now=now).stopped == {}
    GpuSample.objects.filter(gpu=inventory["b"][1], minute=now - 3 * MIN).update(temperature_celsius_mean=95.0)
    assert watchdog_tick(now=now).stopped == {}  # not the newest minute: it has cooled since
    GpuSample.objects.create(gpu=inventory["b"][1], minute=now - MIN, sample_count=12, temperature_celsius_mean=93.4)
    summary = watchdog_tick(now=now + 10 * dt.timedelta(seconds=1))
    assert summary.stopped[running.pk].startswith("Stopped: GPU 1 reached 93 °C, over the 90 °C limit")
    running.job.refresh_from_db()
    assert running.job.state == "running"  # not the job's fault: reconcile requeues it after the checkpoint


def test_only_running_runs_are_stopped(running, notices):
    Run.objects.filter(pk=running.pk).update(state=Run.State.STOPPING, stop_requested_at=START)
    epoch(running, 1, box_loss="inf")
    assert watchdog_tick(now=START + MIN).stopped == {}
    running.refresh_from_db()
    assert running.stop_requested_at == START and running.reason == ""


def test_kill_at_never_passes_the_runs_deadline(running, notices):
    Run.objects.filter(pk=running.pk).update(must_end_by=START + 30 * dt.timedelta(seconds=1))
    running.refresh_from_db()
    epoch(running, 1, box_loss="nan")
    watchdog_tick(now=START)
    running.refresh_from_db()
    assert running.kill_at == START + 30 * dt.timedelta(seconds=1)


def test_the_watchdog_reads_the_same_whatever_the_number_of_live_bookings_and_runs(booking, notices, people,
                                                                                   inventory):
    """Issue #19: no query per live booking (idle check) or per running run (loss check)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def statements() -> int:
        with CaptureQueriesContext(connection) as captured:
            summary = watchdog_tick(now=START + 40 * MIN)
        assert summary.stopped == {} and summary.released == []
        return len(captured.captured_queries)

    def run_on(gpus, reservation):
        job = make_job(user=people["owner"], team=booking["team"], submitted_at=START, state="running",
                       reservation=reservation)
        run = make_run(job=job, gpus=gpus, started_at=START, kind=Run.Kind.RESERVED, reservation=reservation)
        for epoch in range(3):
            RunMetric.objects.create(run=run, event="epoch", epoch=epoch, values={"train/box_loss": 1.0}, at=START)

    for gpu in booking["gpus"]:
        fill_samples(gpu, START, 40, utilization=0.9)  # busy: nothing is idle, nothing released
    run_on(booking["gpus"], booking["reservation"])
    small = statements()
    for gpus in (inventory["a"][2:3], inventory["a"][3:4], inventory["b"][:1], inventory["b"][1:]):
        reservation = make_reservation(user=people["owner"], team=booking["team"], gpus=gpus, start=START,
                                       end=START + 3 * H, status=Reservation.Status.ACTIVE)
        for gpu in gpus:
            fill_samples(gpu, START, 40, utilization=0.9)
        run_on(gpus, reservation)
    assert statements() == small
