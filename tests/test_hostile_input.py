"""Nothing a user sends yields a 500: out-of-range numbers, wrong JSON types, odd paths."""

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

HUGE = 2**70


@pytest.fixture
def client(people, inventory):
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=people['owner']).key}")
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
