"""Booking locks: only inside a transaction, and a bounded wait that reads as "busy"."""

import datetime as dt
import time

import pytest
from django.db import connection

from config.errors import Conflict, ErrorCode
from reservations import services
from reservations.models import Reservation

H = dt.timedelta(hours=1)


def test_the_lock_helper_refuses_to_run_outside_a_transaction():
    # No database needed: the guard answers before any query.
    with pytest.raises(RuntimeError, match="inside transaction"):
        services._lock_booking(user_id=1, team_id=1, gpu_ids=[1])


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_held_gpu_lock_answers_busy_after_the_lock_timeout(postgres_only, people, inventory, future_day, settings):
    from django.db.backends.postgresql.base import DatabaseWrapper

    settings.GPUBOOK_BOOKING_LOCK_TIMEOUT_MS = 200
    gpu = inventory["a"][0]
    holder = DatabaseWrapper(dict(connection.settings_dict), alias="lock_holder")
    try:
        with holder.cursor() as cursor:  # another session holds this GPU's booking lock
            cursor.execute("SELECT pg_advisory_lock(%s, %s)", [services.GPU_LOCK_NAMESPACE, gpu.pk])
        began = time.monotonic()
        with pytest.raises(Conflict) as refused:
            services.reservation_create(
                user=people["owner"], team=people["vision"], gpu_ids=[gpu.pk],
                start=future_day + 9 * H, end=future_day + 10 * H, now=future_day,
            )
        waited = time.monotonic() - began
    finally:
        holder.close()  # ends the session and its advisory lock
    assert refused.value.code == ErrorCode.BUSY and refused.value.http_status == 409
    assert "try again" in refused.value.detail
    assert 0.2 <= waited < 2.0
    assert not Reservation.objects.exists()
    # once the holder is gone, the same booking goes through
    booked = services.reservation_create(
        user=people["owner"], team=people["vision"], gpu_ids=[gpu.pk],
        start=future_day + 9 * H, end=future_day + 10 * H, now=future_day,
    )
    assert booked.gpu_count == 1
