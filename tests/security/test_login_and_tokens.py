"""Guessing is slowed on every door that takes a password; API tokens are stored hashed,
listed and revoked by their owner, expire, and die with a password change."""

import datetime as dt

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import ApiToken, hash_key
from accounts.services import api_token_issue


def token_request(password, *, username="alice", address="10.0.0.1", forwarded=None):
    extra = {"REMOTE_ADDR": address}
    if forwarded:
        extra["HTTP_X_FORWARDED_FOR"] = forwarded
    return APIClient().post("/api/v1/auth/token/", {"username": username, "password": password}, format="json",
                            **extra)


@pytest.mark.django_db
def test_token_endpoint_locks_a_username_even_for_the_right_password(people, settings):
    settings.GPUBOOK_LOGIN_MAX_FAILURES_PER_USERNAME = 5
    for attempt in range(5):
        # A new forged X-Forwarded-For each time: with no trusted proxy it changes nothing.
        response = token_request("wrong", forwarded=f"203.0.113.{attempt}")
        assert response.status_code == 400
    locked = token_request("pw-alice", address="10.9.9.9")
    assert locked.status_code == 429 and locked.json()["code"] == "rate_limited"
    assert token_request("pw-dave", username="dave").status_code == 200  # other accounts unaffected


@pytest.mark.django_db
def test_token_endpoint_locks_an_address_guessing_many_usernames(people, settings):
    settings.GPUBOOK_LOGIN_MAX_FAILURES_PER_ADDRESS = 4
    for name in ("u1", "u2", "u3", "u4"):
        assert token_request("x", username=name, address="10.0.0.7").status_code == 400
    assert token_request("pw-alice", address="10.0.0.7").status_code == 429
    assert token_request("pw-alice", address="10.0.0.8").status_code == 200


@pytest.mark.django_db
def test_the_address_is_the_trusted_proxys_not_the_clients_header(people, settings):
    settings.GPUBOOK_NUM_PROXIES = 1
    settings.GPUBOOK_LOGIN_MAX_FAILURES_PER_ADDRESS = 3
    settings.GPUBOOK_LOGIN_MAX_FAILURES_PER_USERNAME = 100
    for attempt in range(3):  # the client forges the left part; the proxy appends the real one
        token_request("x", username=f"u{attempt}", address="10.0.0.2", forwarded=f"1.2.3.{attempt}, 198.51.100.9")
    assert token_request("pw-alice", address="10.0.0.2", forwarded="9.9.9.9, 198.51.100.9").status_code == 429
    assert token_request("pw-alice", address="10.0.0.2", forwarded="198.51.100.10").status_code == 200


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/accounts/login/", "/admin/login/"])
def test_html_and_admin_logins_lock_out(people, settings, path):
    settings.GPUBOOK_LOGIN_MAX_FAILURES_PER_USERNAME = 5
    browser = Client()
    for _ in range(5):
        assert browser.post(path, {"username": "admin", "password": "nope"}).status_code == 200
    response = browser.post(path, {"username": "admin", "password": "pw-admin"})
    assert "Too many failed log-ins" in response.content.decode()
    assert "_auth_user_id" not in browser.session
    if path == "/accounts/login/":
        assert response.status_code == 429


@pytest.mark.django_db
def test_a_right_password_before_the_limit_clears_the_username(people, settings):
    settings.GPUBOOK_LOGIN_MAX_FAILURES_PER_USERNAME = 3
    for _ in range(2):
        token_request("wrong")
    assert token_request("pw-alice").status_code == 200
    for _ in range(2):
        token_request("wrong")
    assert token_request("pw-alice").status_code == 200


def test_standard_password_validators_are_on():
    from django.contrib.auth.password_validation import validate_password
    from django.core.exceptions import ValidationError

    for weak in ("password123", "12345678901", "short"):
        with pytest.raises(ValidationError):
            validate_password(weak)


def client_with(key):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


@pytest.mark.django_db
def test_tokens_are_stored_hashed_and_work(people):
    response = token_request("pw-alice")
    key = response.json()["token"]
    row = ApiToken.objects.get(pk=response.json()["id"])
    assert row.key_hash == hash_key(key) and key not in {row.key_hash, row.key_prefix, row.name}
    assert client_with(key).get("/api/v1/gpus/").status_code == 200


@pytest.mark.django_db
def test_owner_lists_and_revokes_tokens_others_get_404(people):
    now = timezone.now()
    mine, key = api_token_issue(user=people["owner"], now=now, name="laptop")
    theirs, their_key = api_token_issue(user=people["outsider"], now=now)
    listed = client_with(key).get("/api/v1/auth/tokens/").json()
    assert [row["id"] for row in listed] == [mine.pk] and "key_hash" not in listed[0]
    assert client_with(key).delete(f"/api/v1/auth/tokens/{theirs.pk}/").status_code == 404
    assert client_with(their_key).get("/api/v1/gpus/").status_code == 200
    assert client_with(key).delete(f"/api/v1/auth/tokens/{mine.pk}/").status_code == 204
    assert client_with(key).get("/api/v1/gpus/").status_code == 401


@pytest.mark.django_db
def test_tokens_expire(people, settings):
    settings.GPUBOOK_API_TOKEN_DAYS = 30
    _, key = api_token_issue(user=people["owner"], now=timezone.now() - dt.timedelta(days=31))
    assert client_with(key).get("/api/v1/gpus/").status_code == 401
    _, fresh = api_token_issue(user=people["owner"], now=timezone.now() - dt.timedelta(days=29))
    assert client_with(fresh).get("/api/v1/gpus/").status_code == 200


@pytest.mark.django_db
def test_a_password_change_revokes_tokens(people):
    _, key = api_token_issue(user=people["owner"], now=timezone.now())
    assert client_with(key).get("/api/v1/gpus/").status_code == 200
    user = people["owner"]
    user.set_password("a-new-long-passphrase")
    user.save()
    assert client_with(key).get("/api/v1/gpus/").status_code == 401
    assert ApiToken.objects.get(user=user).revoked_at is not None


@pytest.mark.django_db
def test_the_migration_moves_plain_drf_tokens_to_hashed_ones(people):
    from importlib import import_module

    from django.apps import apps
    from rest_framework.authtoken.models import Token

    old = Token.objects.create(user=people["owner"])
    import_module("accounts.migrations.0002_move_drf_tokens").move(apps, None)
    assert not Token.objects.exists()  # no plain key is left in the database
    assert client_with(old.key).get("/api/v1/gpus/").status_code == 200
