"""Email through a real SMTP server on loopback (aiosmtpd): recipients, bodies, links,
time zones, preferences, and retries while the server is down."""

import datetime as dt

import pytest

from notifications.delivery import deliver_due
from notifications.models import Delivery, EventType, NotificationPreference
from notifications.services import preference_update
from reservations.models import UserProfile
from tests.notifications.conftest import NOW, H, free_port
from tests.support import book

pytestmark = pytest.mark.django_db(transaction=True)


def bodies(message):
    text = message.get_body(preferencelist=("plain",)).get_content()
    html = message.get_body(preferencelist=("html",)).get_content()
    return text, html


def test_a_booking_emails_the_booker_through_real_smtp(people_with_email, inventory, smtp, settings):
    settings.GPUBOOK_BASE_URL = "https://gpubook.example.org"
    UserProfile.objects.create(user=people_with_email["owner"], time_zone="Europe/Berlin")
    reservation = book(people_with_email["owner"], people_with_email["vision"], inventory["a"][1:3], NOW + 2 * H, NOW + 4 * H, now=NOW)

    summary = deliver_due(NOW)

    assert summary.delivered == 1
    (received,) = smtp.messages
    assert received["to"] == ["alice@example.org"]
    assert received["from"] == settings.DEFAULT_FROM_EMAIL
    message = received["message"]
    assert message["Subject"].startswith("[gpubook] Booking confirmed: #")
    assert message["X-Gpubook-Delivery"] == str(Delivery.objects.get().pk)
    text, html = bodies(message)
    link = f"https://gpubook.example.org/reservations/{reservation.pk}/"
    for body in (text, html):
        assert "Your booking is confirmed." in body
        assert "node-a (GPU 1, GPU 2)" in body
        # 10:00 UTC is 11:00 in Berlin in February
        assert "Mon 1 Feb 2027, 11:00 CET" in body and "Mon 1 Feb 2027, 13:00 CET" in body
        assert link in body
    assert "<table" in html and "<table" not in text


def test_html_body_escapes_what_users_typed(people_with_email, inventory, smtp):
    from reservations.services import reservation_create

    reservation_create(
        user=people_with_email["owner"], team=people_with_email["vision"], gpu_ids=[inventory["a"][0].pk],
        start=NOW + 2 * H, end=NOW + 3 * H, now=NOW, note="<script>alert(1)</script>",
    )
    deliver_due(NOW)
    text, html = bodies(smtp.messages[0]["message"])
    assert "&lt;script&gt;" in html and "<script>" not in html
    assert "<script>alert(1)</script>" in text  # plain text is not HTML-escaped


@pytest.mark.parametrize(
    ("preference", "expected"),
    [
        ({}, 1),
        ({"email_enabled": False}, 0),
        ({"muted_events": [EventType.RESERVATION_CONFIRMED]}, 0),
        ({"muted_events": [EventType.RESERVATION_CANCELLED]}, 1),
    ],
    ids=["default", "email-off", "muted", "other-muted"],
)
def test_preferences_choose_which_events_are_emailed(people_with_email, inventory, preference, expected):
    if preference:
        preference_update(user=people_with_email["owner"], **preference)
    book(people_with_email["owner"], people_with_email["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
    assert Delivery.objects.filter(channel="email").count() == expected


def test_no_email_address_means_no_email_delivery(people, inventory):
    book(people["owner"], people["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
    assert Delivery.objects.count() == 0


def test_smtp_down_is_retried_then_delivered(people_with_email, inventory, smtp, settings):
    working_port = settings.EMAIL_PORT
    settings.EMAIL_PORT = free_port()  # nothing listens there
    book(people_with_email["owner"], people_with_email["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)

    assert deliver_due(NOW).retrying == 1
    row = Delivery.objects.get()
    assert row.state == Delivery.State.PENDING and row.attempts == 1
    assert "ConnectionRefusedError" in row.last_error
    assert row.next_attempt_at > NOW

    settings.EMAIL_PORT = working_port
    assert deliver_due(NOW + dt.timedelta(seconds=1)).attempted == 0  # not due yet: backoff
    assert deliver_due(NOW + H).delivered == 1
    assert len(smtp.messages) == 1
    row.refresh_from_db()
    assert (row.state, row.attempts, row.last_error) == (Delivery.State.DELIVERED, 2, "")


def test_preference_defaults_to_everything():
    assert NotificationPreference().wants(EventType.RUN_FAILED)
