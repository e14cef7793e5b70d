"""One status vocabulary: the scheduler's reservation statuses are the booking statuses."""

from reservations.models import Reservation
from scheduler.snapshot import ReservationStatus


def test_scheduler_and_django_name_every_booking_status_alike():
    assert {status.value for status in ReservationStatus} == set(Reservation.Status.values)
