"""Rules that could be walked around: node tokens revocable, /metrics trusts no network by
default, iCal tokens out of access logs, the SSRF filter sees through IPv6 wrappers."""

import ipaddress
import logging

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from config.security_headers import RedactSecretsFilter
from gpus.models import NodeAgentToken
from gpus.telemetry import store
from notifications.transports.webhook.targets import address_allowed


def post_samples(token):
    return APIClient().post("/api/v1/telemetry/samples/", {"node": "node-a", "buckets": []}, format="json",
                            HTTP_AUTHORIZATION=f"Bearer {token}")


@pytest.mark.django_db
def test_node_tokens_are_revoked_by_command_and_in_the_admin(people, inventory):
    now = timezone.now()
    first, first_key = store.agent_token_issue(node=inventory["node_a"], now=now)
    _, second_key = store.agent_token_issue(node=inventory["node_a"], now=now)
    assert post_samples(first_key).status_code == 202
    call_command("revoke_node_token", "--id", str(first.pk), stdout=open("/dev/null", "w"))  # noqa: SIM115
    assert post_samples(first_key).status_code == 401 and post_samples(second_key).status_code == 202

    admin = Client()
    admin.force_login(people["admin"])
    rows = NodeAgentToken.objects.filter(revoked=False)
    response = admin.post("/admin/gpus/nodeagenttoken/", {"action": "revoke", "_selected_action": [r.pk for r in rows]})
    assert response.status_code == 302
    assert post_samples(second_key).status_code == 401


@pytest.mark.django_db
def test_metrics_trust_no_network_unless_configured(people, settings):
    settings.GPUBOOK_METRICS_TOKEN = "metrics-token"
    assert Client().get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 401  # a same-host proxy
    assert Client().get("/metrics", REMOTE_ADDR="127.0.0.1",
                        HTTP_AUTHORIZATION="Bearer metrics-token").status_code == 200
    settings.GPUBOOK_METRICS_ALLOWED_NETWORKS = ["10.0.0.0/8"]
    assert Client().get("/metrics", REMOTE_ADDR="10.0.0.5").status_code == 200


def test_ical_tokens_never_reach_a_log_line():
    record = logging.LogRecord("gunicorn.access", logging.INFO, __file__, 1,
                               '10.0.0.1 "GET /ical/%s.ics HTTP/1.1" 200', ("s3cret-feed-token",), None)
    RedactSecretsFilter().filter(record)
    assert "s3cret" not in record.getMessage() and "/ical/[token].ics" in record.getMessage()


def test_access_loggers_go_through_the_redacting_handler():
    from django.conf import settings

    for name in ("gunicorn.access", "django.server"):
        handlers = settings.LOGGING["loggers"][name]["handlers"]
        assert all("redact_secrets" in settings.LOGGING["handlers"][h]["filters"] for h in handlers)


@pytest.mark.parametrize(
    "address",
    ["::127.0.0.1", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "64:ff9b::127.0.0.1", "64:ff9b::10.1.2.3",
     "64:ff9b:1::a00:1", "2002:7f00:1::1", "2002:a9fe:a9fe::1", "2001:0:4136:e378:8000:63bf:80ff:fffe"],
)
def test_ssrf_filter_unwraps_ipv4_inside_ipv6(address):
    assert not address_allowed(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["93.184.215.14", "::ffff:93.184.215.14", "64:ff9b::5db8:d70e", "2606:4700::1"])
def test_public_addresses_still_pass(address):
    assert address_allowed(ipaddress.ip_address(address))


@pytest.mark.django_db
def test_a_non_manager_moving_an_approved_booking_sends_it_back_to_pending(people, inventory, future_day):
    import datetime as dt

    from reservations import services
    from reservations.models import Reservation

    team = people["vision"]
    team.requires_approval = True
    team.save()
    now = timezone.now()
    start = future_day + dt.timedelta(hours=9)
    booking = services.reservation_create(user=people["owner"], team=team, gpu_ids=[inventory["a"][0].pk],
                                          start=start, end=start + dt.timedelta(hours=1), now=now)
    services.reservation_approve(reservation_id=booking.pk, actor=people["manager"], now=now)
    moved = services.reservation_reschedule(reservation_id=booking.pk, actor=people["owner"], now=now,
                                            start=start + dt.timedelta(days=1), end=start + dt.timedelta(days=1, hours=20))
    assert moved.status == Reservation.Status.PENDING
    from notifications.models import EventType, Notice

    waiting = Notice.objects.filter(
        event_type=EventType.RESERVATION_AWAITING_APPROVAL, payload__reservation__id=booking.pk
    )
    assert waiting.count() == 2  # at creation, and again after the move: the managers decide anew
    services.reservation_approve(reservation_id=booking.pk, actor=people["manager"], now=now)
    by_manager = services.reservation_reschedule(reservation_id=booking.pk, actor=people["manager"], now=now,
                                                 end=start + dt.timedelta(days=1, hours=2))
    assert by_manager.status == Reservation.Status.CONFIRMED  # a manager's own move stays approved


@pytest.mark.django_db
def test_outsiders_get_404_for_another_teams_team_settings(people):
    outsider = APIClient()
    outsider.force_authenticate(people["outsider"])
    hidden = outsider.patch(f"/api/v1/teams/{people['vision'].pk}/", {"max_days_ahead": 5}, format="json")
    missing = outsider.patch("/api/v1/teams/999999/", {"max_days_ahead": 5}, format="json")
    assert hidden.status_code == missing.status_code == 404 and hidden.json() == missing.json()
    own = outsider.patch(f"/api/v1/teams/{people['nlp'].pk}/", {"max_days_ahead": 5}, format="json")
    assert own.status_code == 403  # visible, but only admins change it
