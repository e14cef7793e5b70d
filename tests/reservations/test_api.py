"""The REST API against every persona: owner, teammate, manager, outsider, admin, anonymous."""

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework import serializers
from rest_framework.test import APIClient

from reservations.models import Reservation
from reservations.serializers import ReservationCreateSerializer, ReservationSerializer, booking_input
from tests.support import book, client_for

H = dt.timedelta(hours=1)


@pytest.fixture
def api(people):
    return {name: client_for(user, api=True) for name, user in people.items() if name not in {"vision", "nlp"}}


def iso(value: dt.datetime) -> str:
    return value.isoformat()


def create(client, gpus, start, end, team):
    return client.post(
        "/api/v1/reservations/",
        {"gpus": [g.pk for g in gpus], "start": iso(start), "end": iso(end), "team": team.pk},
        format="json",
    )


def assert_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    body = response.json()
    assert body["code"] == code and isinstance(body["detail"], str) and body["detail"]
    return body


PLAIN = {"gpus": [3, 1], "team": 2, "start": "2031-01-06T09:00:00+01:00", "end": " 2031-01-06T10:00:00Z "}
BOOKING_INPUTS = [  # (payload, whether booking_input parses it itself)
    (PLAIN, True),
    (PLAIN | {"gpus": []}, True),
    (PLAIN | {"gpus": list(range(1, 65))}, True),
    (PLAIN | {"unknown": "ignored"}, True),
    (PLAIN | {"team": 2**63 - 1}, True),
    (PLAIN | {"note": "  a note "}, False),
    (PLAIN | {"gpus": list(range(1, 66))}, False),
    (PLAIN | {"gpus": [1.0]}, False),
    (PLAIN | {"gpus": ["1"]}, False),
    (PLAIN | {"gpus": [True]}, False),
    (PLAIN | {"gpus": [0]}, False),
    (PLAIN | {"gpus": 1}, False),
    (PLAIN | {"team": 2**63}, False),
    (PLAIN | {"team": "2"}, False),
    (PLAIN | {"team": None}, False),
    (PLAIN | {"start": "2031-01-06T09:00:00"}, False),
    (PLAIN | {"end": 5}, False),
    ({k: v for k, v in PLAIN.items() if k != "end"}, False),
    ([PLAIN], False),
]


@pytest.mark.parametrize(("payload", "parsed_lean"), BOOKING_INPUTS)
def test_the_lean_booking_parse_gives_what_the_serializer_gives(payload, parsed_lean):
    # booking_input parses the plain booking itself (issue #19) and leaves the rest to
    # ReservationCreateSerializer, so every refusal keeps the serializer's answer.
    lean = booking_input(payload)
    assert (lean is not None) == parsed_lean
    if lean is not None:
        serializer = ReservationCreateSerializer(data=payload)
        assert serializer.is_valid(), serializer.errors
        assert lean == dict(serializer.validated_data)


@pytest.mark.django_db
class TestAuth:
    def test_token_exchange(self, people):
        response = APIClient().post("/api/v1/auth/token/", {"username": "alice", "password": "pw-alice"}, format="json")
        assert response.status_code == 200
        key = response.json()["token"]
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
        assert client.get("/api/v1/gpus/").status_code == 200

    def test_wrong_password(self, people):
        response = APIClient().post("/api/v1/auth/token/", {"username": "alice", "password": "nope"}, format="json")
        assert_error(response, 400, "invalid_credentials")

    @pytest.mark.parametrize(
        "path", ["/api/v1/gpus/", "/api/v1/reservations/", "/api/v1/teams/", "/api/v1/gpus/1/availability/"]
    )
    def test_every_endpoint_needs_authentication(self, people, path):
        assert_error(APIClient().get(path), 401, "not_authenticated")

    def test_bad_token(self, people):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION="Token not-a-token")
        assert_error(client.get("/api/v1/gpus/"), 401, "authentication_failed")

    def test_unknown_api_path_answers_in_the_error_shape(self, api):
        assert_error(api["owner"].get("/api/v1/nothing-here/"), 404, "not_found")

    def test_schema_and_docs(self, api):
        schema = api["owner"].get("/api/schema/")
        assert schema.status_code == 200 and b"/api/v1/reservations/" in schema.content
        assert api["owner"].get("/api/docs/").status_code == 200


@pytest.mark.django_db
class TestReservationsApi:
    def test_create_then_read(self, api, people, inventory, future_day):
        response = create(api["owner"], inventory["a"][:2], future_day + 9 * H, future_day + 11 * H, people["vision"])
        assert response.status_code == 201, response.content
        body = response.json()
        assert body["gpus"] == sorted(g.pk for g in inventory["a"][:2])
        assert body["gpu_hours"] == 4.0 and body["status"] == "confirmed" and body["user"] == "alice"
        assert body["start"] == iso(future_day + 9 * H)
        detail = api["teammate"].get(f"/api/v1/reservations/{body['id']}/")
        assert detail.status_code == 200

    def test_offset_is_respected(self, api, people, inventory, future_day):
        start = (future_day + 9 * H).astimezone(dt.timezone(dt.timedelta(hours=5, minutes=30)))
        response = create(api["owner"], inventory["a"][:1], start, start + H, people["vision"])
        assert response.status_code == 201
        assert response.json()["start"] == iso(future_day + 9 * H)

    def test_the_answer_is_what_the_declared_fields_render(self, api, people, inventory, future_day):
        # ReservationSerializer builds its answer by hand (issue #19); the fields it declares
        # give the schema, so the two must not drift apart.
        made = book(people["owner"], people["vision"], inventory["a"][1:3], future_day + 9 * H, note="über ✓")
        reservation = Reservation.objects.get(pk=made.pk)
        reservation.release_reason = "released early"
        for shown in (made, reservation):
            serializer = ReservationSerializer(shown)
            assert serializer.data == serializers.Serializer.to_representation(serializer, shown)
        assert ReservationSerializer(made).data == ReservationSerializer(reservation).data | {"release_reason": ""}

    def test_conflict_lists_the_collision(self, api, people, inventory, future_day):
        create(api["owner"], inventory["a"][:1], future_day + 9 * H, future_day + 11 * H, people["vision"])
        response = create(api["outsider"], inventory["a"][:1], future_day + 10 * H, future_day + 12 * H, people["nlp"])
        body = assert_error(response, 409, "slot_conflict")
        assert body["conflicts"] == [
            {"start": iso(future_day + 9 * H), "end": iso(future_day + 11 * H), "gpus": [inventory["a"][0].pk]}
        ]

    def test_quota_error_says_what_is_left(self, api, people, inventory, future_day):
        people["vision"].monthly_gpu_hours = 3
        people["vision"].save()
        body = assert_error(
            create(api["owner"], inventory["a"][:2], future_day + 9 * H, future_day + 11 * H, people["vision"]),
            409, "quota_exceeded",
        )
        assert body["remaining_gpu_hours"] == 3.0 and body["requested_gpu_hours"] == 4.0

    @pytest.mark.parametrize(
        ("payload", "code"),
        [
            ({"start": "2030-01-01T09:00:00", "end": "2030-01-01T10:00:00+00:00"}, "naive_datetime"),
            ({"start": "tomorrow", "end": "2030-01-01T10:00:00+00:00"}, "invalid_datetime"),
            ({"start": 12, "end": "2030-01-01T10:00:00+00:00"}, "invalid_datetime"),
            ({"gpus": "all"}, "invalid"),
            ({"gpus": [987654]}, "unknown_gpu"),
            ({"gpus": []}, "no_gpus"),
            ({"team": 987654}, "unknown_team"),
            ({"start": "2001-01-01T09:00:00+00:00", "end": "2001-01-01T10:00:00+00:00"}, "past_slot"),
            ({"start": "OFFGRID", "end": None}, "off_grid"),
            ({"start": "END", "end": None}, "invalid_range"),
            ({"note": "x" * 501}, "invalid"),
        ],
    )
    def test_bad_input_gets_a_code_and_loses_nothing(self, api, people, inventory, future_day, payload, code):
        body = {
            "gpus": [inventory["a"][0].pk], "team": people["vision"].pk,
            "start": iso(future_day + 9 * H), "end": iso(future_day + 10 * H),
        }
        body.update(payload)
        if payload.get("start") == "OFFGRID":
            body["start"], body["end"] = iso(future_day + 9 * H + dt.timedelta(minutes=7)), iso(future_day + 10 * H)
        if payload.get("start") == "END":
            body["start"], body["end"] = iso(future_day + 10 * H), iso(future_day + 9 * H)
        response = api["owner"].post("/api/v1/reservations/", body, format="json")
        assert_error(response, 400, code)
        assert Reservation.objects.count() == 0

    def test_gpus_of_two_nodes(self, api, people, inventory, future_day):
        response = create(api["owner"], [inventory["a"][0], inventory["b"][0]], future_day + 9 * H, future_day + 10 * H, people["vision"])
        assert_error(response, 400, "multiple_nodes")

    def test_malformed_json(self, api):
        response = api["owner"].post("/api/v1/reservations/", "{not json", content_type="application/json")
        assert_error(response, 400, "malformed_request")

    def test_outsider_cannot_book_for_another_team(self, api, people, inventory, future_day):
        response = create(api["outsider"], inventory["a"][:1], future_day + 9 * H, future_day + 10 * H, people["vision"])
        assert_error(response, 403, "not_team_member")

    def test_scoping_by_persona(self, api, people, inventory, future_day):
        mine = create(api["owner"], inventory["a"][:1], future_day + 9 * H, future_day + 10 * H, people["vision"]).json()
        theirs = create(api["outsider"], inventory["b"][:1], future_day + 9 * H, future_day + 10 * H, people["nlp"]).json()

        def ids(persona, query=""):
            return {row["id"] for row in api[persona].get(f"/api/v1/reservations/{query}").json()["results"]}

        assert ids("owner") == {mine["id"]}
        assert ids("teammate") == {mine["id"]} and ids("teammate", "?mine=1") == set()
        assert ids("outsider") == {theirs["id"]}
        assert ids("admin") == {mine["id"], theirs["id"]}
        assert_error(api["outsider"].get(f"/api/v1/reservations/{mine['id']}/"), 404, "not_found")
        for action in ("cancel", "release"):
            assert_error(api["outsider"].post(f"/api/v1/reservations/{mine['id']}/{action}/"), 404, "not_found")
        assert_error(api["outsider"].patch(f"/api/v1/reservations/{mine['id']}/", {"end": iso(future_day + 11 * H)},
                                           format="json"), 404, "not_found")

    def test_filters(self, api, people, inventory, future_day):
        create(api["owner"], inventory["a"][:1], future_day + 9 * H, future_day + 10 * H, people["vision"])
        create(api["owner"], inventory["a"][1:2], future_day + 30 * H, future_day + 31 * H, people["vision"])
        client = api["owner"]
        by_gpu = client.get(f"/api/v1/reservations/?gpu={inventory['a'][1].pk}").json()
        assert by_gpu["count"] == 1
        window = client.get("/api/v1/reservations/", {"from": iso(future_day), "to": iso(future_day + 24 * H)}).json()
        assert window["count"] == 1
        assert_error(client.get("/api/v1/reservations/?gpu=abc"), 400, "invalid_parameter")
        assert_error(client.get("/api/v1/reservations/", {"from": "2030-01-01T00:00"}), 400, "naive_datetime")

    def test_teammate_cannot_cancel_but_manager_can(self, api, people, inventory, future_day):
        booking = create(api["owner"], inventory["a"][:1], future_day + 9 * H, future_day + 10 * H, people["vision"]).json()
        assert_error(api["teammate"].post(f"/api/v1/reservations/{booking['id']}/cancel/"), 403, "not_permitted")
        response = api["manager"].post(f"/api/v1/reservations/{booking['id']}/cancel/", {"reason": "plans"}, format="json")
        assert response.status_code == 200 and response.json()["status"] == "cancelled"
        assert_error(api["owner"].post(f"/api/v1/reservations/{booking['id']}/cancel/"), 409, "not_cancellable")

    def test_shorten_and_extend(self, api, people, inventory, future_day):
        booking = create(api["owner"], inventory["a"][:1], future_day + 9 * H, future_day + 12 * H, people["vision"]).json()
        url = f"/api/v1/reservations/{booking['id']}/"
        assert api["owner"].patch(url, {"end": iso(future_day + 10 * H)}, format="json").json()["end"] == iso(future_day + 10 * H)
        assert api["owner"].patch(url, {"end": iso(future_day + 14 * H)}, format="json").json()["gpu_hours"] == 5.0
        assert_error(api["owner"].patch(url, {}, format="json"), 400, "nothing_to_change")
        assert_error(api["owner"].post("/api/v1/reservations/abc/cancel/"), 404, "not_found")

    def test_list_query_budget(self, api, people, inventory, future_day):
        for day in range(10):
            for index, gpu in enumerate(inventory["a"]):
                create(api["owner"], [gpu], future_day + (day * 24 + index) * H, future_day + (day * 24 + index + 1) * H,
                       people["vision"])
        api["owner"].get("/api/v1/gpus/")  # the token's last-used time is written at most once a minute
        with CaptureQueriesContext(connection) as queries:
            response = api["owner"].get("/api/v1/reservations/")
        assert response.json()["count"] == 40
        # 1 token + user, 2 count for pagination, 3 the page with team/user/node joined,
        # 4 the booked GPUs of the page (prefetch). Nothing per row.
        statements = [query["sql"] for query in queries.captured_queries]
        assert len(statements) == 4, "\n".join(statements)
        assert "accounts_apitoken" in statements[0]
        assert "COUNT(" in statements[1]
        assert "reservations_reservation" in statements[2] and "reservations_team" in statements[2]
        assert "reservations_reservationgpu" in statements[3]


@pytest.mark.django_db
class TestGpusAndTeams:
    def test_gpu_list(self, api, inventory):
        rows = api["outsider"].get("/api/v1/gpus/").json()["results"]
        assert len(rows) == 6
        assert rows[0] == {
            "id": inventory["a"][0].pk, "node": "node-a", "node_id": inventory["node_a"].pk, "index": 0,
            "uuid": "", "model_name": "NVIDIA A100", "memory_mib": 81920, "state": "active",
        }

    def test_availability(self, api, people, inventory, future_day):
        create(api["owner"], inventory["a"][:1], future_day + 9 * H, future_day + 10 * H, people["vision"])
        gpu = inventory["a"][0]
        query = {"from": iso(future_day + 8 * H), "to": iso(future_day + 12 * H)}
        free = api["outsider"].get(f"/api/v1/gpus/{gpu.pk}/availability/", query).json()["free"]
        assert free == [
            {"start": iso(future_day + 8 * H), "end": iso(future_day + 9 * H)},
            {"start": iso(future_day + 10 * H), "end": iso(future_day + 12 * H)},
        ]
        node = api["outsider"].get(f"/api/v1/nodes/{inventory['node_b'].pk}/availability/", query).json()
        assert node["free"] == [{"start": iso(future_day + 8 * H), "end": iso(future_day + 12 * H)}]
        assert_error(api["owner"].get(f"/api/v1/gpus/{gpu.pk}/availability/", {"from": "x", "to": "y"}), 400,
                     "invalid_datetime")
        assert_error(api["owner"].get(f"/api/v1/nodes/{inventory['node_b'].pk}/availability/",
                                      {"from": iso(future_day), "to": iso(future_day + dt.timedelta(days=90))}),
                     400, "range_too_long")

    def test_availability_defaults_to_a_day_from_now(self, api, people, inventory, future_day):
        create(api["owner"], inventory["a"][:1], future_day + 9 * H, future_day + 10 * H, people["vision"])
        gpu = inventory["a"][0]
        day = api["outsider"].get(f"/api/v1/gpus/{gpu.pk}/availability/", {"from": iso(future_day)}).json()
        assert (day["from"], day["to"]) == (iso(future_day), iso(future_day + 24 * H))
        assert day["free"] == [{"start": iso(future_day), "end": iso(future_day + 9 * H)},
                               {"start": iso(future_day + 10 * H), "end": iso(future_day + 24 * H)}]
        before = timezone.now()
        now = api["outsider"].get(f"/api/v1/gpus/{gpu.pk}/availability/").json()
        start = dt.datetime.fromisoformat(now["from"])
        assert before <= start <= timezone.now()
        assert dt.datetime.fromisoformat(now["to"]) - start == 24 * H
        assert_error(api["owner"].get(f"/api/v1/gpus/{gpu.pk}/availability/", {"from": "9999-12-31T12:00:00+00:00"}),
                     400, "invalid_range")

    def test_teams_are_scoped_and_show_usage(self, api, people, inventory, future_day):
        rows = api["owner"].get("/api/v1/teams/").json()["results"]
        assert [(row["name"], row["role"]) for row in rows] == [("vision", "member")]
        assert set(rows[0]["usage"]) == {
            "month", "quota_gpu_hours", "booked_gpu_hours", "backfill_gpu_hours", "used_gpu_hours", "remaining_gpu_hours",
        }
        assert [row["name"] for row in api["admin"].get("/api/v1/teams/").json()["results"]] == ["nlp", "vision"]
        assert_error(api["outsider"].get(f"/api/v1/teams/{people['vision'].pk}/"), 404, "not_found")

    def test_only_admins_change_quotas(self, api, people):
        url = f"/api/v1/teams/{people['vision'].pk}/"
        assert_error(api["manager"].patch(url, {"monthly_gpu_hours": 999}, format="json"), 403, "not_permitted")
        response = api["admin"].patch(url, {"monthly_gpu_hours": 500, "user_daily_cap_gpu_hours": 24}, format="json")
        assert response.status_code == 200 and response.json()["monthly_gpu_hours"] == 500
        assert_error(api["admin"].patch(url, {"monthly_gpu_hours": -1}, format="json"), 400, "invalid")
        assert_error(api["admin"].patch(url, {"time_zone": "Mars/Olympus"}, format="json"), 400, "invalid")
