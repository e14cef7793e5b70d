"""Approvals: the managers' page, approve and reject in one click each, and the notices
(managers when a booking waits, the booker when it is decided)."""

import datetime as dt

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from notifications.models import EventType, Notice
from notifications.transports.email import render_email
from reservations.approvals import pending_for_manager, reservation_reject
from reservations.models import AuditEntry, Reservation
from reservations.services import reservation_create
from tests.security.tokens import token_for

H = dt.timedelta(hours=1)


@pytest.fixture
def approving(people, inventory):
    for name in ("owner", "teammate", "manager", "outsider", "admin"):
        people[name].email = f"{people[name].username}@example.org"
        people[name].save(update_fields=["email"])
    people["vision"].requires_approval = True
    people["vision"].save(update_fields=["requires_approval"])
    return people


def book(people, inventory, start, who="owner", gpus=1):
    return reservation_create(
        user=people[who], team=people["vision"], gpu_ids=[g.pk for g in inventory["a"][:gpus]],
        start=start, end=start + 2 * H, note="needs the A100s", now=timezone.now(),
    )


def deliveries_to(notice: Notice) -> set[str]:
    return {d.target for d in notice.deliveries.all()}


@pytest.mark.django_db
def test_managers_hear_of_a_waiting_booking_and_see_it_on_their_page(client, approving, inventory, future_day):
    waiting = book(approving, inventory, future_day + 9 * H)
    assert waiting.status == Reservation.Status.PENDING
    notice = Notice.objects.get(event_type=EventType.RESERVATION_AWAITING_APPROVAL)
    assert deliveries_to(notice) == {"bob@example.org"}  # the manager, not the booker or the outsider
    subject, text, _ = render_email(notice, approving["manager"])
    assert "waits for approval" in subject.lower() and "/approvals/" in text

    client.force_login(approving["manager"])
    page = client.get("/approvals/").content.decode()
    assert f'id="approval-{waiting.pk}"' in page and "needs the A100s" in page and "alice" in page
    assert [r.pk for r in pending_for_manager(user=approving["admin"])] == [waiting.pk]

    for persona in ("teammate", "outsider"):  # members and other teams' people see nothing to decide
        client.force_login(approving[persona])
        assert f"approval-{waiting.pk}" not in client.get("/approvals/").content.decode()


@pytest.mark.django_db
def test_approve_in_one_click(client, approving, inventory, future_day):
    waiting = book(approving, inventory, future_day + 9 * H)
    client.force_login(approving["teammate"])
    client.post(f"/approvals/{waiting.pk}/approve/")
    waiting.refresh_from_db()
    assert waiting.status == Reservation.Status.PENDING  # a member may not approve

    client.force_login(approving["manager"])
    response = client.post(f"/approvals/{waiting.pk}/approve/", follow=True)
    assert "approved" in response.content.decode()
    waiting.refresh_from_db()
    assert waiting.status == Reservation.Status.CONFIRMED
    confirmed = Notice.objects.get(event_type=EventType.RESERVATION_CONFIRMED)
    assert deliveries_to(confirmed) == {"alice@example.org"}
    again = client.post(f"/approvals/{waiting.pk}/approve/", follow=True).content.decode()
    assert "not waiting for approval" in again


@pytest.mark.django_db
def test_reject_with_a_reason_frees_the_gpus_and_tells_the_booker(client, approving, inventory, future_day):
    start = future_day + 9 * H
    waiting = book(approving, inventory, start)
    client.force_login(approving["manager"])
    no_reason = client.post(f"/approvals/{waiting.pk}/reject/", {"reason": "  "}, follow=True).content.decode()
    assert "Say why" in no_reason
    waiting.refresh_from_db()
    assert waiting.status == Reservation.Status.PENDING

    client.post(f"/approvals/{waiting.pk}/reject/", {"reason": "the A100s are for the paper deadline"})
    waiting.refresh_from_db()
    assert waiting.status == Reservation.Status.CANCELLED
    assert waiting.release_reason == "rejected: the A100s are for the paper deadline"
    assert AuditEntry.objects.filter(reservation=waiting, action="reject", actor=approving["manager"]).exists()
    rejected = Notice.objects.get(event_type=EventType.RESERVATION_REJECTED)
    assert deliveries_to(rejected) == {"alice@example.org"}
    _, text, html = render_email(rejected, approving["owner"])
    assert "the A100s are for the paper deadline" in text and "not approved by bob" in html

    # The slot is free again: someone else's request for the same GPUs is accepted.
    assert book(approving, inventory, start, who="teammate").status == Reservation.Status.PENDING

    client.force_login(approving["outsider"])
    assert client.post(f"/approvals/{waiting.pk}/reject/", {"reason": "x"}).status_code == 404


@pytest.mark.django_db
def test_reject_through_the_api(approving, inventory, future_day):
    waiting = book(approving, inventory, future_day + 9 * H)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token_for(approving['owner'])}")
    refused = api.post(f"/api/v1/reservations/{waiting.pk}/reject/", {"reason": "mine"}, format="json")
    assert refused.status_code == 403 and refused.json()["code"] == "not_permitted"  # the booker cannot
    api.credentials(HTTP_AUTHORIZATION=f"Token {token_for(approving['manager'])}")
    done = api.post(f"/api/v1/reservations/{waiting.pk}/reject/", {"reason": "no budget"}, format="json")
    assert done.status_code == 200 and done.json()["status"] == "cancelled"
    twice = api.post(f"/api/v1/reservations/{waiting.pk}/reject/", {"reason": "no budget"}, format="json")
    assert twice.status_code == 409 and twice.json()["code"] == "not_pending"


@pytest.mark.django_db
def test_reject_rules(approving, inventory, future_day):
    from config.errors import DomainError

    waiting = book(approving, inventory, future_day + 9 * H)
    with pytest.raises(DomainError) as too_long:
        reservation_reject(reservation_id=waiting.pk, actor=approving["manager"], reason="x" * 500,
                           now=timezone.now())
    assert too_long.value.code == "reason_too_long"
    with pytest.raises(DomainError) as unseen:
        reservation_reject(reservation_id=waiting.pk, actor=approving["outsider"], reason="no", now=timezone.now())
    assert unseen.value.code == "not_found"  # another team's booking is not revealed
