"""Nothing a user sends yields a 500: out-of-range numbers, wrong JSON types, odd paths."""

import datetime as dt

import pytest
from rest_framework.test import APIClient

from tests.security.tokens import token_for

HUGE = 2**70


@pytest.fixture
def client(people, inventory):
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token_for(people['owner'])}")
    return api


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/api/v1/reservations/", {"gpus": [HUGE], "team": 1, "start": "2030-01-01T09:00:00Z",
                                           "end": "2030-01-01T10:00:00Z"}),
        ("post", "/api/v1/reservations/", {"gpus": [1], "team": HUGE, "start": "2030-01-01T09:00:00Z",
                                           "end": "2030-01-01T10:00:00Z"}),
        ("post", "/api/v1/reservations/", ["not", "an", "object"]),
        ("post", "/api/v1/reservations/", {"gpus": [1], "team": 1, "start": "9999-12-31T23:30:00+00:00",
                                           "end": "9999-12-31T23:59:00-14:00"}),
        ("get", f"/api/v1/reservations/?gpu={HUGE}", None),
        ("get", f"/api/v1/reservations/?team={HUGE}", None),
        ("get", f"/api/v1/reservations/{HUGE}/", None),
        ("post", f"/api/v1/reservations/{HUGE}/cancel/", None),
        ("patch", f"/api/v1/reservations/{HUGE}/", {"end": "2030-01-01T10:00:00Z"}),
        ("get", f"/api/v1/gpus/{HUGE}/availability/?from=2030-01-01T00:00:00Z&to=2030-01-02T00:00:00Z", None),
        ("post", "/api/v1/jobs/", {"spec": {"team": "vision", "resources": {"gpu": HUGE}}}),
        ("post", "/api/v1/jobs/", {"spec": "a string"}),
        ("post", "/api/v1/jobs/", {"spec_yaml": "!!python/object/apply:os.system ['true']"}),
        ("post", f"/api/v1/jobs/{HUGE}/attach/", {"reservation": HUGE}),
        ("post", "/api/v1/runs/1/report/", {"event": "epoch"}),
        ("get", f"/api/v1/runs/{HUGE}/", None),
        ("patch", "/api/v1/teams/1/", ["x"]),
    ],
)
def test_no_500(client, method, path, body):
    response = getattr(client, method)(path, body, format="json") if body is not None else getattr(client, method)(path)
    assert response.status_code < 500, response.content
    assert set(response.json()) >= {"code", "detail"} or response.status_code < 300


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path",
    [
        "/calendar/?date=99999-01-01", "/calendar/?date=0000-00-00&view=month", "/calendar/?view=week&date=9999-12-31",
        "/calendar/events.json?start=9999-12-31T23:59:00-14:00&end=9999-12-31T23:59:59-14:00",
        "/calendar/events.json?start=x&end=y", "/calendar/events.json", f"/reservations/{HUGE}/",
        f"/jobs/{HUGE}/", f"/runs/{HUGE}/", "/reports/utilization/?from=99999-01-01",
        "/reports/idle/?threshold=abc", "/reports/quota/?month=2026-13", "/ical/not-a-token.ics",
    ],
)
def test_pages_never_500(people, inventory, path):
    from django.test import Client

    browser = Client()
    browser.force_login(people["owner"])
    assert browser.get(path).status_code < 500


@pytest.mark.django_db
def test_booking_form_never_500(people, inventory):
    from django.test import Client

    browser = Client()
    browser.force_login(people["owner"])
    for data in ({"gpus": [str(HUGE)], "date": "9999-12-31", "start": "23:30", "end": "25:00", "team": str(HUGE)},
                 {"gpus": ["x"], "date": "x", "start": "x", "end": "x", "team": "x"}, {}):
        assert browser.post("/book/", data).status_code < 500


# --- NUL bytes, deep nesting, out-of-range numbers (issue #14) --------------------------------------

@pytest.fixture
def admin_api(people, inventory):
    api = APIClient()
    api.force_authenticate(people["admin"])
    return api


def assert_error_shape(response, status=None):
    assert 400 <= response.status_code < 500, (response.status_code, response.content[:300])
    if status is not None:
        assert response.status_code == status, response.content[:300]
    if response.headers.get("Content-Type", "").startswith("application/json"):
        assert {"code", "detail"} <= set(response.json()), response.content[:300]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("get", "/api/v1/reservations/?status=%00", None, 400),
        ("get", "/api/v1/jobs/?state=a%00b", None, 400),
        ("get", "/api/v1/reservations/%00/", None, None),
        ("post", "/api/v1/auth/token/", {"username": "a\x00b", "password": "x"}, 400),
        ("post", "/api/v1/jobs/", {"spec_yaml": "task_name: a\x00b"}, 400),
        ("get", "/api/v1/notifications/webhooks/abc/", None, 404),
        ("get", "/api/v1/notifications/webhooks/1.5/", None, 404),
        ("get", f"/api/v1/notifications/webhooks/{HUGE}/", None, 404),
        ("get", f"/api/v1/telemetry/samples/?gpu={2**63}", None, 400),  # a 500 on SQLite once
        ("patch", "/api/v1/teams/{vision}/", {"max_days_ahead": 2147483647}, 400),
        ("patch", "/api/v1/teams/{vision}/", {"max_days_ahead": 2**40}, 400),
        ("post", "/api/v1/telemetry/samples/", {"node": "node-a", "buckets": [{"index": 0, "sample_count": 2**40}]},
         None),
    ],
)
def test_hostile_api_input_is_a_4xx_in_the_error_shape(admin_api, people, method, path, body, status):
    path = path.format(vision=people["vision"].pk)
    call = getattr(admin_api, method)
    response = call(path, body, format="json") if body is not None else call(path)
    assert_error_shape(response, status)


@pytest.mark.django_db
@pytest.mark.parametrize("query", [f"limit={2**70}", "limit=-1", f"offset={2**70}", "offset=-5", "limit=abc"])
def test_pagination_parameters_past_64_bits(admin_api, query):
    response = admin_api.get(f"/api/v1/reservations/?{query}")
    assert response.status_code == 200 and response.json()["results"] == []


@pytest.mark.django_db
def test_pagination_has_a_max_limit(admin_api, people, inventory):
    from config.input_guards import BoundedLimitOffsetPagination

    assert BoundedLimitOffsetPagination.max_limit == 1000
    response = admin_api.get(f"/api/v1/gpus/?limit={2**70}")
    assert response.status_code == 200


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path",
    [
        "/reports/idle/?from=0001-01-01&to=9999-12-31", "/reports/utilization/?from=0001-01-01&to=9999-12-31",
        "/reports/idle/?to=0001-01-01", "/reports/idle.csv?from=0001-01-01&to=9999-12-31",
        "/calendar/?date=%00", "/ical/a%00b.ics", "/reports/idle/?threshold=%00",
    ],
)
def test_pages_with_hostile_parameters_never_500(people, inventory, path):
    from django.test import Client

    browser = Client()
    browser.force_login(people["owner"])
    assert browser.get(path).status_code < 500


@pytest.mark.django_db
def test_nul_in_a_login_form_is_a_400(people):
    from django.test import Client

    assert Client().post("/accounts/login/", {"username": "a\x00b", "password": "x"}).status_code == 400
    assert Client().post("/admin/login/", {"username": "a\x00b", "password": "x"}).status_code == 400


@pytest.mark.django_db
def test_a_team_allowed_to_book_2147483647_days_ahead_still_books(admin_api, people, inventory, future_day):
    from reservations.models import Team

    Team.objects.filter(pk=people["vision"].pk).update(max_days_ahead=2147483647)  # as the admin site could
    start = future_day + dt.timedelta(hours=9)
    response = admin_api.post("/api/v1/reservations/", {
        "gpus": [inventory["a"][0].pk], "team": people["vision"].pk, "start": start.isoformat(),
        "end": (start + dt.timedelta(hours=1)).isoformat()}, format="json")
    assert response.status_code == 201, response.content


@pytest.mark.django_db
def test_deeply_nested_json_is_a_400_everywhere(admin_api):
    deep = "[" * 50_000 + "]" * 50_000
    for path in ("/api/v1/reservations/", "/api/v1/jobs/", "/api/v1/auth/token/", "/api/v1/notifications/webhooks/"):
        response = admin_api.generic("POST", path, deep, content_type="application/json")
        assert_error_shape(response, 400)


@pytest.mark.django_db
@pytest.mark.parametrize(("field", "value"), [("sample_count", 2147483648), ("memory_total_bytes", 2**63),
                                              ("memory_used_bytes_max", 1e300)])
def test_telemetry_numbers_past_the_column_are_a_400(people, inventory, field, value):
    from django.utils import timezone

    from gpus.telemetry import store

    _, token = store.agent_token_issue(node=inventory["node_a"], now=timezone.now())
    minute = timezone.now().replace(second=0, microsecond=0) - dt.timedelta(minutes=2)
    response = APIClient().post("/api/v1/telemetry/samples/", {"node": "node-a", "buckets": [
        {"minute": minute.isoformat(), "index": 0, field: value}]}, format="json", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert_error_shape(response, 400)
    assert response.json()["code"] == "invalid_samples"
