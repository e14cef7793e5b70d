"""The admin: quota bars, and a cancel action that goes through the booking service."""

import datetime as dt

import pytest
from django.test import Client
from django.utils import timezone

from reservations.models import AuditEntry, Reservation
from reservations.services import reservation_create


@pytest.fixture
def admin_client(people):
    client = Client()
    client.force_login(people["admin"])
    return client


@pytest.mark.django_db
def test_changelists_render(admin_client, inventory):
    for url in ("/admin/reservations/team/", "/admin/reservations/reservation/", "/admin/gpus/gpu/",
                "/admin/gpus/node/", "/admin/gpus/maintenancewindow/", "/admin/reservations/auditentry/"):
        assert admin_client.get(url).status_code == 200, url
    page = admin_client.get("/admin/reservations/team/").content.decode()
    assert "0.0 / 100 GPU-h" in page


@pytest.mark.django_db
def test_cancel_action_refunds_through_the_service(admin_client, people, inventory):
    start = timezone.now().replace(minute=0, second=0, microsecond=0) + dt.timedelta(days=2)
    booking = reservation_create(user=people["owner"], team=people["vision"], gpu_ids=[inventory["a"][0].pk],
                                 start=start, end=start + dt.timedelta(hours=2), now=timezone.now())
    response = admin_client.post("/admin/reservations/reservation/",
                                 {"action": "cancel_selected", "_selected_action": [booking.pk]}, follow=True)
    assert response.status_code == 200
    booking.refresh_from_db()
    assert booking.status == Reservation.Status.CANCELLED
    entry = AuditEntry.objects.filter(reservation=booking, action="cancel").get()
    assert entry.actor == people["admin"]
