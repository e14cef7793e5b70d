"""Production settings by environment: `check --deploy` is clean with the documented
environment (deploy/production.env), a short SECRET_KEY stops the process, seed_demo refuses to
run on a production database, and the calendar feed is compressed and answers 304."""

import gzip
import io
import json
import os
import re
import subprocess
import sys
from unittest import mock

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from config.env import ConfigError, env_header_pair
from tests.deploy.conftest import ROOT, production_env

# drf-spectacular adds its schema-generation warnings to `check --deploy`; they are about the
# API documentation (owned by the API code), not about how the server is deployed.
SCHEMA_DOC_CHECKS = {"drf_spectacular.W001", "drf_spectacular.W002"}


def manage(args: list[str], env: dict[str, str], tmp_path) -> subprocess.CompletedProcess:
    base = {
        "PATH": os.environ["PATH"],
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path}/check.sqlite3",
        "GPUBOOK_VAR_DIR": str(tmp_path / "var"),
    }
    return subprocess.run(
        [sys.executable, "manage.py", *args], env={**base, **env}, cwd=ROOT, capture_output=True, text=True,
        timeout=120,
    )


def issue_ids(output: str) -> set[str]:
    return set(re.findall(r"\(([a-z_]+\.[EW]\d{3})\)", output))


def test_check_deploy_is_clean_with_the_documented_production_env(tmp_path):
    result = manage(["check", "--deploy", "--fail-level", "WARNING"], production_env(), tmp_path)
    found = issue_ids(result.stdout + result.stderr)
    assert found <= SCHEMA_DOC_CHECKS, result.stdout + result.stderr
    if not found:
        assert result.returncode == 0, result.stderr


def test_check_deploy_flags_a_bare_debug_false_env(tmp_path):
    """Negative control: DEBUG=false alone is not a production configuration."""
    result = manage(["check", "--deploy"], {"DEBUG": "false", "SECRET_KEY": "short"}, tmp_path)
    found = issue_ids(result.stdout + result.stderr)
    assert {"security.W004", "security.W008", "security.W009"} <= found, result.stdout + result.stderr


def test_a_short_secret_key_stops_the_process(tmp_path):
    result = manage(["check"], production_env(SECRET_KEY="x" * 49), tmp_path)
    assert result.returncode != 0
    assert "SECRET_KEY has 49 characters; at least 50 are required" in result.stderr


def test_a_half_configured_single_sign_on_stops_the_process_and_a_whole_one_starts(tmp_path):
    half = manage(["check"], production_env(GPUBOOK_OIDC_CLIENT_ID="gpubook"), tmp_path)
    assert half.returncode != 0
    assert "GPUBOOK_OIDC_CLIENT_SECRET, GPUBOOK_OIDC_AUTHORIZATION_ENDPOINT" in half.stderr
    whole = manage(["check"], production_env(GPUBOOK_OIDC_CLIENT_ID="gpubook", GPUBOOK_OIDC_CLIENT_SECRET="s",
                                             GPUBOOK_OIDC_ISSUER="https://id.example.com/"), tmp_path)
    assert whole.returncode == 0, whole.stderr  # the provider is not asked anything at start-up


def test_proxy_ssl_header_is_parsed_or_refused(monkeypatch):
    monkeypatch.setenv("SECURE_PROXY_SSL_HEADER", "X-Forwarded-Proto: https")
    assert env_header_pair("SECURE_PROXY_SSL_HEADER") == ("HTTP_X_FORWARDED_PROTO", "https")
    monkeypatch.setenv("SECURE_PROXY_SSL_HEADER", "https")
    with pytest.raises(ConfigError, match="SECURE_PROXY_SSL_HEADER"):
        env_header_pair("SECURE_PROXY_SSL_HEADER")
    monkeypatch.delenv("SECURE_PROXY_SSL_HEADER")
    assert env_header_pair("SECURE_PROXY_SSL_HEADER") is None


@pytest.mark.django_db
def test_seed_demo_refuses_without_debug_or_i_know(settings):
    from django.contrib.auth import get_user_model

    settings.DEBUG = False
    with pytest.raises(CommandError, match="refuses to run with DEBUG=false"):
        call_command("seed_demo", stdout=io.StringIO())
    assert not get_user_model().objects.filter(username="admin").exists()


@pytest.mark.django_db
def test_seed_demo_runs_with_i_know(settings, tmp_path):
    from django.contrib.auth import get_user_model

    settings.DEBUG = False
    settings.VAR_DIR = tmp_path
    settings.GPUBOOK_DATA_ROOTS = [str(tmp_path / "datasets" / "{team}"), str(tmp_path / "datasets" / "shared")]
    call_command("seed_demo", "--i-know", stdout=io.StringIO())
    assert get_user_model().objects.filter(username="admin", is_superuser=True).exists()


def test_events_feed_is_compressed_and_answers_304(client, people, inventory, future_day):
    from reservations import services

    for index in range(4):  # enough bookings that the feed is worth compressing
        services.reservation_create(
            user=people["owner"], team=people["vision"], gpu_ids=[inventory["a"][index].pk],
            start=future_day + dt_hours(8 + index), end=future_day + dt_hours(10 + index),
            now=future_day - dt_hours(24), note=f"booking {index}",
        )
    client.force_login(people["owner"])
    params = {"start": future_day.isoformat(), "end": (future_day + dt_hours(24)).isoformat()}
    plain = client.get("/calendar/events.json", params)
    assert plain.status_code == 200 and "Content-Encoding" not in plain
    compressed = client.get("/calendar/events.json", params, headers={"accept-encoding": "gzip, br"})
    assert compressed["Content-Encoding"] == "gzip"
    assert "Accept-Encoding" in compressed["Vary"]
    body = gzip.decompress(compressed.content)
    # The same feed, but for its clock reading: the two requests may straddle a second.
    unzipped, unpacked = json.loads(body), json.loads(plain.content)
    assert unzipped.pop("now") and unpacked.pop("now")
    assert unzipped == unpacked and unzipped["events"]
    assert len(compressed.content) < len(plain.content) / 3
    etag = compressed["ETag"]
    assert etag
    # A minute later the feed's "now" differs, but what it shows does not: still a 304.
    later = timezone.now() + dt_hours(1) / 60
    with mock.patch("reservations.views.timezone.now", return_value=later):
        again = client.get("/calendar/events.json", params, headers={"accept-encoding": "gzip", "if-none-match": etag})
    assert again.status_code == 304 and again.content == b""
    # A change to what the feed shows changes the ETag: the 304 is never stale.
    services.reservation_create(
        user=people["owner"], team=people["vision"], gpu_ids=[inventory["b"][0].pk],
        start=future_day + dt_hours(12), end=future_day + dt_hours(13), now=future_day - dt_hours(24), note="new",
    )
    changed = client.get("/calendar/events.json", params, headers={"accept-encoding": "gzip", "if-none-match": etag})
    assert changed.status_code == 200 and changed["ETag"] != etag


def dt_hours(hours: int):
    import datetime as dt

    return dt.timedelta(hours=hours)


def test_the_wsgi_module_boots_the_worker_before_its_first_request(tmp_path):
    """config/wsgi.py (what gunicorn loads in each worker) imports every view and freezes what it
    loaded: otherwise the first requests after a deploy import the URLconf, and full
    collections rescan those objects (benchmarks/booking.py, #19)."""
    probe = (
        "import gc, sys\n"
        "import config.wsgi\n"
        "print('reservations.api' in sys.modules, gc.get_freeze_count() > 10000)\n"
    )
    env = {
        "PATH": os.environ["PATH"],
        **production_env(),
        "DATABASE_URL": f"sqlite:///{tmp_path}/wsgi.sqlite3",
        "GPUBOOK_VAR_DIR": str(tmp_path / "var"),
    }
    done = subprocess.run([sys.executable, "-c", probe], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["True", "True"], done.stderr
