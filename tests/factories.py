"""The one factories module: rows for telemetry, report, quota and watchdog tests, written straight to the database (the
booking rules are tested elsewhere; these tests need fixed, past or odd data)."""

import datetime as dt

from gpus.telemetry.store import BUCKET_FIELDS, samples_record
from reservations.models import Reservation, ReservationGpu
from training.models import Run, TrainingImage, TrainingJob


def make_reservation(*, user, team, gpus, start, end, status=Reservation.Status.COMPLETED):
    reservation = Reservation.objects.create(
        user=user, team=team, node=gpus[0].node, gpu_count=len(gpus), start=start, end=end, status=status,
        created_at=start - dt.timedelta(days=1), updated_at=start - dt.timedelta(days=1),
    )
    for gpu in gpus:
        ReservationGpu.objects.create(reservation=reservation, gpu=gpu, start=start, end=end,
                                      occupies=status != Reservation.Status.CANCELLED)
    return reservation


def make_job(*, user, team, submitted_at, reservation=None, priority="medium", state=TrainingJob.State.QUEUED,
             name="detector"):
    image, _ = TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")
    return TrainingJob.objects.create(
        team=team, user=user, name=name, image=image, spec={}, priority=priority, reservation=reservation,
        state=state, submitted_at=submitted_at,
    )


def make_run(*, job, gpus, started_at, ended_at=None, kind=Run.Kind.RESERVED, reservation=None,
             state=None, must_end_by=None):
    state = state or (Run.State.RUNNING if ended_at is None else Run.State.SUCCEEDED)
    return Run.objects.create(
        job=job, kind=kind, reservation=reservation, node=gpus[0].node, gpu_ids=[gpu.pk for gpu in gpus],
        gpu_indices=[gpu.index for gpu in gpus], state=state, created_at=started_at, started_at=started_at,
        ended_at=ended_at, must_end_by=must_end_by or started_at + dt.timedelta(hours=12),
    )


def fill_samples(gpu, start, minutes, *, utilization=None, temperature=None):
    """One bucket per minute from `start`, stored the way an agent's post is (samples_record,
    which keeps the hourly roll-up current); utilization/temperature: a number or a function
    of the minute's offset."""
    buckets = []
    for offset in range(minutes):
        def value(figure, offset=offset):
            return figure(offset) if callable(figure) else figure

        buckets.append({
            "minute": start + dt.timedelta(minutes=offset), "index": gpu.index, "uuid": gpu.uuid or "",
            **dict.fromkeys(BUCKET_FIELDS), "sample_count": 12,
            "utilization_mean": value(utilization), "utilization_max": value(utilization),
            "temperature_celsius_mean": value(temperature), "temperature_celsius_max": value(temperature),
        })
    samples_record(node=gpu.node, buckets=buckets, now=start + dt.timedelta(minutes=minutes))
