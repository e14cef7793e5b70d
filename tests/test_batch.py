"""config.batch.fetch_together: several `.values()` reads in one round trip on PostgreSQL,
giving exactly what each read gives alone (the types included)."""

import datetime as dt

import pytest
from django.db import connection
from django.db.models import DurationField, ExpressionWrapper, F, Sum
from django.test.utils import CaptureQueriesContext

from config.batch import fetch_together
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
