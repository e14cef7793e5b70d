"""config.batch.fetch_together: several `.values()` reads in one round trip on PostgreSQL,
giving exactly what each read gives alone (the types included); fetch_prepared: the same,
its statement built once per shape."""

import datetime as dt

import pytest
from django.db import connection
from django.db.models import DurationField, ExpressionWrapper, F, Sum
from django.test.utils import CaptureQueriesContext

from config.batch import fetch_prepared, fetch_together
from reservations.models import Reservation, Team
from tests.support import book

H = dt.timedelta(hours=1)


@pytest.fixture
def bookings(people, inventory, future_day):
    for hour in (9, 12):
        book(people["owner"], people["vision"], inventory["a"][:2], future_day + hour * H, hours=2,
             note="über ✓")
    return future_day


def reads():
    length = ExpressionWrapper(F("end") - F("start"), output_field=DurationField())
    return [
        Reservation.objects.order_by("start").values("id", "start", "end", "note", "gpu_count", "status"),
        Reservation.objects.order_by().values("team_id").annotate(total=Sum(length)),
        Team.objects.order_by("name").values("name", "fair_share", "requires_approval", "created_at"),
        Team.objects.filter(pk__in=[]).values("id"),  # can match nothing: not even sent
        Reservation.objects.filter(note="nobody").values("id"),
    ]


@pytest.mark.django_db
def test_fetch_together_gives_what_each_read_gives_alone(bookings):
    alone = [list(queryset) for queryset in reads()]
    together = fetch_together(*reads())
    assert together == alone
    assert alone[1][0]["total"] == dt.timedelta(hours=4) and alone[0][0]["note"] == "über ✓"


@pytest.mark.postgres
@pytest.mark.django_db
def test_on_postgresql_they_travel_in_one_statement(postgres_only, bookings):
    with CaptureQueriesContext(connection) as captured:
        fetch_together(*reads())
    assert len(captured.captured_queries) == 1


def test_only_values_querysets_are_taken():
    with pytest.raises(TypeError):
        fetch_together(Team.objects.all())


def by_team_in(values):
    """Bookings of a team that overlap [start, end), and that team's row."""
    return [
        Reservation.objects.filter(team_id=values["team"], start__lt=values["end"], end__gt=values["start"])
        .order_by("start").values("id", "start", "note"),
        Team.objects.filter(pk__in=values["teams"]).order_by("pk").values("name"),
    ]


def counting(build):
    calls = []

    def counted(values):
        calls.append(values)
        return build(values)

    return counted, calls


@pytest.mark.django_db
def test_prepared_gives_what_fetch_together_gives_for_each_set_of_values(bookings, people):
    build, _ = counting(by_team_in)
    asks = [
        {"team": people["vision"].pk, "teams": [people["vision"].pk], "start": bookings, "end": bookings + 13 * H},
        {"team": people["nlp"].pk, "teams": [people["nlp"].pk], "start": bookings, "end": bookings + 10 * H},
        {"team": people["vision"].pk, "teams": [people["nlp"].pk], "start": bookings + 10 * H,
         "end": bookings + 20 * H},
    ]
    for values in asks:
        assert fetch_prepared(key="test-by-team", build=build, values=values) == fetch_together(*by_team_in(values))
    assert [len(rows) for rows in fetch_prepared(key="test-by-team", build=build, values=asks[0])] == [2, 1]


@pytest.mark.postgres
@pytest.mark.django_db
def test_on_postgresql_a_shape_is_built_once(postgres_only, bookings, people):
    build, calls = counting(by_team_in)
    values = {"team": people["vision"].pk, "teams": [people["vision"].pk], "start": bookings, "end": bookings + 3 * H}
    fetch_prepared(key="test-built-once", build=build, values=values)
    first = len(calls)  # with the values, then with two sets of stand-ins
    with CaptureQueriesContext(connection) as captured:
        rows = fetch_prepared(key="test-built-once", build=build, values={**values, "end": bookings + 13 * H})
    assert len(calls) == first == 3
    assert len(captured.captured_queries) == 1 and len(rows[0]) == 2


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_value_changed_on_its_way_is_not_kept_and_still_read_right(postgres_only, bookings, people):
    def shifted(values):  # arithmetic on a value: a cached statement could not follow it
        return by_team_in({**values, "end": values["end"] + H})

    build, calls = counting(shifted)
    values = {"team": people["vision"].pk, "teams": [people["vision"].pk], "start": bookings, "end": bookings + 8 * H}
    for _ in range(2):
        assert fetch_prepared(key="test-shifted", build=build, values=values) == fetch_together(*shifted(values))
    assert len(calls) == 3 + 1 + 1  # the check, then built again on each call
