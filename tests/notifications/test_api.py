"""Preferences and team webhooks through the API (the production URLs), against every
persona, and the admin's team scoping for staff managers."""

import pytest
from django.test import Client
from rest_framework.test import APIClient

from notifications.models import NotificationPreference, Webhook
from tests.support import client_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(people):
    return {name: client_for(user, api=True) for name, user in people.items() if name not in {"vision", "nlp"}}


def test_preferences_read_and_update(api, people):
    body = api["owner"].get("/api/v1/notifications/preferences/").json()
    assert body["email_enabled"] is True and body["muted_events"] == []
    assert "reservation.reminder" in body["event_types"]
    response = api["owner"].patch(
        "/api/v1/notifications/preferences/", {"muted_events": ["reservation.reminder"]}, format="json"
    )
    assert response.status_code == 200 and response.json()["muted_events"] == ["reservation.reminder"]
    preference = NotificationPreference.objects.get(user=people["owner"])
    assert preference.email_enabled and preference.muted_events == ["reservation.reminder"]
    bad = api["owner"].patch("/api/v1/notifications/preferences/", {"muted_events": ["nope"]}, format="json")
    assert bad.status_code == 400 and bad.json()["code"]


def test_preferences_need_a_login():
    assert APIClient().get("/api/v1/notifications/preferences/").status_code == 401


def test_a_manager_manages_the_teams_webhooks(api, people, loopback_allowed):
    created = api["manager"].post(
        "/api/v1/notifications/webhooks/",
        {"team": people["vision"].pk, "url": "http://127.0.0.1:9/hook", "events": ["run.failed"]},
        format="json",
    )
    assert created.status_code == 201, created.content
    hook = created.json()
    assert hook["secret"] and hook["events"] == ["run.failed"]
    changed = api["manager"].patch(
        f"/api/v1/notifications/webhooks/{hook['id']}/", {"enabled": False, "rotate_secret": True}, format="json"
    )
    assert changed.status_code == 200 and changed.json()["enabled"] is False
    assert changed.json()["secret"] != hook["secret"]
    assert api["admin"].get("/api/v1/notifications/webhooks/").json()["count"] == 1
    assert api["manager"].delete(f"/api/v1/notifications/webhooks/{hook['id']}/").status_code == 204
    assert not Webhook.objects.exists()


def test_members_and_outsiders_cannot_see_or_touch_a_teams_webhooks(api, people, loopback_allowed):
    webhook = Webhook.objects.create(team=people["vision"], url="http://127.0.0.1:9/hook")
    for persona in ("owner", "outsider"):
        assert api[persona].get("/api/v1/notifications/webhooks/").json()["count"] == 0
        response = api[persona].get(f"/api/v1/notifications/webhooks/{webhook.pk}/")
        assert response.status_code == 404 and response.json()["code"] == "not_found"
        assert api[persona].delete(f"/api/v1/notifications/webhooks/{webhook.pk}/").status_code == 404
    refused = api["owner"].post(
        "/api/v1/notifications/webhooks/", {"team": people["vision"].pk, "url": "http://127.0.0.1:9/x"}, format="json"
    )
    assert refused.status_code == 403 and refused.json()["code"] == "not_permitted"
    # a manager of vision is nobody in nlp
    other = api["manager"].post(
        "/api/v1/notifications/webhooks/", {"team": people["nlp"].pk, "url": "http://127.0.0.1:9/x"}, format="json"
    )
    assert other.status_code == 403


def test_unsafe_webhook_urls_are_refused_with_the_error_shape(api, people, settings):
    settings.GPUBOOK_WEBHOOK_ALLOWED_NETWORKS = []
    for url in ("http://127.0.0.1:8000/", "http://169.254.169.254/latest/meta-data/", "http://[::1]/"):
        response = api["manager"].post(
            "/api/v1/notifications/webhooks/", {"team": people["vision"].pk, "url": url}, format="json"
        )
        assert response.status_code == 400, url
        assert response.json()["code"] == "unsafe_webhook_url"


def test_a_webhook_whose_host_does_not_resolve_yet_is_kept(api, people):
    """It used to be a 500 (found by the schemathesis CLI); every delivery vets the address again."""
    response = api["manager"].post(
        "/api/v1/notifications/webhooks/", {"team": people["vision"].pk, "url": "https://hooks.example.invalid/x"},
        format="json",
    )
    assert response.status_code == 201, response.content
    assert Webhook.objects.get().url == "https://hooks.example.invalid/x"


def test_staff_managers_see_only_their_teams_in_admin(people, loopback_allowed):
    from django.contrib.auth.models import Permission

    manager = people["manager"]
    manager.is_staff = True
    manager.save()
    manager.user_permissions.add(*Permission.objects.filter(content_type__app_label="notifications"))
    Webhook.objects.create(team=people["vision"], url="http://127.0.0.1:9/vision")
    Webhook.objects.create(team=people["nlp"], url="http://127.0.0.1:9/nlp")
    client = Client()
    client.force_login(manager)
    page = client.get("/admin/notifications/webhook/").content.decode()
    assert "127.0.0.1:9/vision" in page and "127.0.0.1:9/nlp" not in page


def test_admin_refuses_an_unsafe_webhook_url(people, settings):
    settings.GPUBOOK_WEBHOOK_ALLOWED_NETWORKS = []
    client = Client()
    client.force_login(people["admin"])
    response = client.post(
        "/admin/notifications/webhook/add/",
        {"team": people["vision"].pk, "url": "http://10.0.0.5/hook", "events": "[]", "enabled": "on",
         "secret": "s3cret-s3cret", "description": ""},
    )
    assert response.status_code == 200  # the form again, with the error
    assert "private, loopback or link-local" in response.content.decode()
    assert not Webhook.objects.exists()
