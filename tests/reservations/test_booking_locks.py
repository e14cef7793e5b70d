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


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_one_lock_statement_takes_the_team_row_before_the_gpu_locks(postgres_only, people, inventory,
                                                                        future_day, settings):
    """The locks are one statement now (issue #19); their order is what keeps two bookings
    from deadlocking, so it is checked: a booking that waits for its team's row holds no GPU
    lock yet, and goes through once the row is free."""
    import threading

    from django.db import connections
    from django.db.backends.postgresql.base import DatabaseWrapper

    settings.GPUBOOK_BOOKING_LOCK_TIMEOUT_MS = 20_000
    gpu, team = inventory["a"][0], people["vision"]
    holder = DatabaseWrapper(dict(connection.settings_dict), alias="team_holder")
    observer = DatabaseWrapper(dict(connection.settings_dict), alias="observer")
    outcome = {}

    def book():
        try:
            outcome["booked"] = services.reservation_create(
                user=people["owner"], team=team, gpu_ids=[gpu.pk],
                start=future_day + 9 * H, end=future_day + 10 * H, now=future_day,
            )
        finally:
            connections.close_all()

    try:
        holder.set_autocommit(False)
        with holder.cursor() as cursor:  # an admin's settings change holds the team row
            cursor.execute("SELECT 1 FROM reservations_team WHERE id = %s FOR UPDATE", [team.pk])
        booking = threading.Thread(target=book)
        booking.start()
        deadline = time.monotonic() + 10
        with observer.cursor() as cursor:
            while True:  # until the booking waits on a row lock (the team's)
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND query LIKE %s", ["%pg_advisory_xact_lock%"],
                )
                if cursor.fetchone()[0]:
                    break
                assert time.monotonic() < deadline, "the booking never waited for the team row"
                time.sleep(0.02)
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND objid = %s",
                [services.GPU_LOCK_NAMESPACE, gpu.pk],
            )
            assert cursor.fetchone()[0] == 0  # no GPU lock held (or asked) while it waits for the team
        holder.rollback()
        booking.join(timeout=20)
        assert not booking.is_alive() and outcome["booked"].gpu_count == 1
    finally:
        holder.close()
        observer.close()
