"""Signed webhooks against a real HTTP receiver on loopback: signatures, retries with
backoff, failure after the limit, resend from admin, team scoping, refused targets."""

import datetime as dt
import json
import time

import pytest
from django.test import Client

from config.errors import DomainError
from notifications.delivery import deliver_due, retry_delay
from notifications.models import Delivery, EventType, Webhook
from notifications.services import delivery_resend, webhook_create
from notifications.transports.webhook.signing import sign, verify
from notifications.transports.webhook.targets import UnsafeTarget, address_allowed, check_url
from tests.notifications.conftest import NOW, H, add_webhook
from tests.support import book

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def quiet_owner(people):
    """No email address: these tests look at webhook deliveries only."""
    return people


def test_each_delivery_is_signed_and_shaped(quiet_owner, inventory, receivers):
    receiver = receivers()
    add_webhook(quiet_owner["vision"], receiver)
    reservation = book(quiet_owner["owner"], quiet_owner["vision"], inventory["a"][:2], NOW + 2 * H, NOW + 3 * H, now=NOW)
    before = int(time.time())

    assert deliver_due(NOW).delivered == 1

    (request,) = receiver.requests
    assert request["signature_ok"]
    assert request["path"] == "/hooks/gpubook?source=test"
    headers = request["headers"]
    assert headers["content-type"] == "application/json"
    assert headers["x-gpubook-event"] == "reservation.confirmed"
    assert abs(int(headers["x-gpubook-timestamp"]) - before) <= 5
    row = Delivery.objects.get()
    assert headers["x-gpubook-delivery"] == str(row.pk)
    body = request["json"]
    assert set(body) == {"id", "type", "time", "payload"}
    assert body["id"] == str(row.notice_id)
    assert body["type"] == "reservation.confirmed"
    assert dt.datetime.fromisoformat(body["time"]) == NOW
    assert body["payload"]["reservation"]["id"] == reservation.pk
    assert body["payload"]["reservation"]["gpus"] == [
        {"id": gpu.pk, "index": gpu.index} for gpu in inventory["a"][:2]
    ]


def test_a_wrong_secret_does_not_verify():
    body = json.dumps({"id": "x"}).encode()
    signature = sign(secret="right", timestamp="1700000000", body=body)
    assert verify(secret="right", timestamp="1700000000", body=body, signature=signature)
    assert not verify(secret="wrong", timestamp="1700000000", body=body, signature=signature)
    assert not verify(secret="right", timestamp="1700000001", body=body, signature=signature)
    assert not verify(secret="right", timestamp="1700000000", body=body + b" ", signature=signature)


def test_500_then_200_is_delivered_once_retried(quiet_owner, inventory, receivers):
    receiver = receivers()
    receiver.statuses = [500]
    add_webhook(quiet_owner["vision"], receiver)
    book(quiet_owner["owner"], quiet_owner["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)

    assert deliver_due(NOW).retrying == 1
    row = Delivery.objects.get()
    assert row.state == Delivery.State.PENDING
    assert row.last_error == "attempt 1: HTTP 500: receiver says no"
    assert NOW + dt.timedelta(seconds=15) <= row.next_attempt_at <= NOW + dt.timedelta(seconds=30)
    assert deliver_due(NOW + dt.timedelta(seconds=10)).attempted == 0

    assert deliver_due(row.next_attempt_at).delivered == 1
    row.refresh_from_db()
    assert (row.state, row.attempts) == (Delivery.State.DELIVERED, 2)
    assert [request["status"] for request in receiver.requests] == [500, 200]
    assert receiver.delivery_ids == [str(row.pk)] * 2
    assert all(request["signature_ok"] for request in receiver.requests)


def test_receiver_down_for_the_whole_window_fails_visibly_and_can_be_resent(
    quiet_owner, inventory, receivers, settings
):
    settings.GPUBOOK_NOTIFY_MAX_ATTEMPTS = 4
    receiver = receivers()
    add_webhook(quiet_owner["vision"], receiver)
    book(quiet_owner["owner"], quiet_owner["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
    receiver.close()  # down from the start

    now = NOW
    for attempt in range(1, 5):
        summary = deliver_due(now)
        assert summary.attempted == 1
        row = Delivery.objects.get()
        assert row.attempts == attempt
        now = row.next_attempt_at
    assert summary.failed == 1
    assert row.state == Delivery.State.FAILED
    assert row.last_error.startswith("attempt 4: ConnectionRefusedError")
    assert deliver_due(now + 24 * H).attempted == 0  # failed stays failed

    # visible in the admin delivery log, and resendable from there
    admin_client = Client()
    admin_client.force_login(quiet_owner["admin"])
    page = admin_client.get("/admin/notifications/delivery/?state=failed")
    assert page.status_code == 200 and str(row.pk) in page.content.decode()
    back_up = receivers()  # the receiver comes back (on a new port)
    Webhook.objects.update(url=back_up.url)
    back_up.secret = Webhook.objects.get().secret
    response = admin_client.post(
        "/admin/notifications/delivery/", {"action": "resend", "_selected_action": [str(row.pk)]}
    )
    assert response.status_code == 302
    row.refresh_from_db()
    assert row.state == Delivery.State.PENDING

    later = now + 48 * H
    assert deliver_due(later).delivered == 1
    row.refresh_from_db()
    assert (row.state, row.attempts) == (Delivery.State.DELIVERED, 5)
    assert back_up.delivery_ids == [str(row.pk)]  # the same id as every earlier attempt
    assert back_up.requests[0]["signature_ok"]


def test_resend_after_a_resend_gets_a_fresh_retry_budget(quiet_owner, inventory, receivers, settings):
    settings.GPUBOOK_NOTIFY_MAX_ATTEMPTS = 2
    receiver = receivers()
    receiver.statuses = [500, 500, 500, 500]
    add_webhook(quiet_owner["vision"], receiver)
    book(quiet_owner["owner"], quiet_owner["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
    deliver_due(NOW)
    deliver_due(NOW + H)
    assert Delivery.objects.get().state == Delivery.State.FAILED
    assert delivery_resend(delivery_ids=[Delivery.objects.get().pk], now=NOW + 2 * H) == 1
    assert deliver_due(NOW + 2 * H).retrying == 1  # attempt 1 of the new budget
    assert deliver_due(NOW + 3 * H).failed == 1


def test_a_teams_webhook_only_sees_that_teams_events(people, inventory, receivers):
    vision_hook, nlp_hook = receivers(), receivers()
    add_webhook(people["vision"], vision_hook)
    add_webhook(people["nlp"], nlp_hook)

    book(people["owner"], people["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
    book(people["outsider"], people["nlp"], inventory["b"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
    deliver_due(NOW)

    vision_teams = {r["json"]["payload"]["reservation"]["team"]["name"] for r in vision_hook.requests}
    nlp_teams = {r["json"]["payload"]["reservation"]["team"]["name"] for r in nlp_hook.requests}
    assert vision_teams == {"vision"} and nlp_teams == {"nlp"}
    assert len(vision_hook.requests) == len(nlp_hook.requests) == 1


def test_webhook_event_filter_and_disabled_webhooks(people, inventory, receivers):
    only_cancellations, disabled = receivers(), receivers()
    add_webhook(people["vision"], only_cancellations, events=[EventType.RESERVATION_CANCELLED])
    add_webhook(people["vision"], disabled, enabled=False)
    book(people["owner"], people["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
    assert Delivery.objects.count() == 0


def test_a_webhook_disabled_after_the_notice_fails_without_calling(people, inventory, receivers):
    receiver = receivers()
    webhook = add_webhook(people["vision"], receiver)
    book(people["owner"], people["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
    Webhook.objects.filter(pk=webhook.pk).update(enabled=False)
    assert deliver_due(NOW).failed == 1
    assert receiver.requests == []
    assert Delivery.objects.get().last_error == "the webhook is disabled"


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "10.1.2.3", "172.16.0.9", "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0",  # noqa: S104 — refused, not bound
     "::1", "fe80::1", "fc00::1", "::ffff:127.0.0.1", "224.0.0.1"],
)
def test_private_loopback_and_link_local_targets_are_refused(address, settings):
    import ipaddress

    settings.GPUBOOK_WEBHOOK_ALLOWED_NETWORKS = []
    assert not address_allowed(ipaddress.ip_address(address))


def test_public_addresses_are_allowed(settings):
    import ipaddress

    settings.GPUBOOK_WEBHOOK_ALLOWED_NETWORKS = []
    assert address_allowed(ipaddress.ip_address("93.184.215.14"))
    assert address_allowed(ipaddress.ip_address("2606:4700::1111"))


def test_loopback_needs_the_setting(people, settings, receivers):
    receiver = receivers()
    check_url(receiver.url)  # allowed by the fixture
    settings.GPUBOOK_WEBHOOK_ALLOWED_NETWORKS = []
    with pytest.raises(UnsafeTarget, match="private, loopback or link-local"):
        check_url(receiver.url)
    with pytest.raises(DomainError) as refused:
        webhook_create(actor=people["admin"], team_id=people["vision"].pk, url="http://localhost:8080/x")
    assert refused.value.code == "unsafe_webhook_url"
    with pytest.raises(UnsafeTarget, match="https:// or http://"):
        check_url("file:///etc/passwd")
    with pytest.raises(UnsafeTarget, match="credentials"):
        check_url("https://user:pw@example.org/")


def test_a_target_that_turned_private_fails_without_calling(people, inventory, receivers, settings):
    receiver = receivers()
    add_webhook(people["vision"], receiver)
    book(people["owner"], people["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
    settings.GPUBOOK_WEBHOOK_ALLOWED_NETWORKS = []
    assert deliver_due(NOW).failed == 1
    assert receiver.requests == []
    assert "loopback" in Delivery.objects.get().last_error


def test_backoff_grows_exponentially_with_jitter_and_is_capped(settings):
    import random

    settings.GPUBOOK_NOTIFY_RETRY_BASE_SECONDS = 30
    settings.GPUBOOK_NOTIFY_RETRY_MAX_SECONDS = 3600
    rng = random.Random(7)
    for attempt, step in [(1, 30), (2, 60), (3, 120), (5, 480), (8, 3600), (20, 3600)]:
        delays = {retry_delay(attempt, rng=rng).total_seconds() for _ in range(20)}
        assert all(step / 2 <= delay <= step for delay in delays)
        assert len(delays) > 1  # jittered


def test_the_receiver_snippet_in_the_docs_verifies_a_real_delivery(quiet_owner, inventory, receivers):
    import re
    from pathlib import Path

    from django.conf import settings as django_settings

    receiver = receivers()
    webhook = add_webhook(quiet_owner["vision"], receiver)
    book(quiet_owner["owner"], quiet_owner["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
    deliver_due(NOW)
    (request,) = receiver.requests

    docs = (Path(django_settings.BASE_DIR) / "docs" / "webhooks.md").read_text()
    (snippet,) = re.findall(r"```python\n(.*?)```", docs, flags=re.DOTALL)
    namespace: dict = {}
    exec(compile(snippet, "docs/webhooks.md", "exec"), namespace)  # noqa: S102 — our own docs
    namespace["SECRET"] = webhook.secret.encode()
    headers = {
        "X-Gpubook-Timestamp": request["headers"]["x-gpubook-timestamp"],
        "X-Gpubook-Signature": request["headers"]["x-gpubook-signature"],
    }
    assert namespace["verify_gpubook"](headers, request["body"]) is True
    assert namespace["verify_gpubook"](headers, request["body"] + b"tampered") is False
    namespace["SECRET"] = b"someone else's secret"
    assert namespace["verify_gpubook"](headers, request["body"]) is False


def test_a_dead_receiver_costs_one_attempt_per_run_not_one_per_delivery(people, inventory, receivers):
    dead, alive = receivers(), receivers()
    add_webhook(people["vision"], dead)
    add_webhook(people["nlp"], alive)
    dead.close()
    for hour in range(3):
        book(people["owner"], people["vision"], inventory["a"][hour:hour + 1], NOW + 2 * H, NOW + 3 * H, now=NOW)
    book(people["outsider"], people["nlp"], inventory["b"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)

    summary = deliver_due(NOW)

    assert (summary.retrying, summary.deferred, summary.delivered) == (1, 2, 1)
    assert len(alive.requests) == 1  # another team's endpoint is not held up
    assert Delivery.objects.filter(state=Delivery.State.PENDING, attempts=0).count() == 2  # untouched, still due
