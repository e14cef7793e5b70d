"""The one permission layer (reservations.selectors) and the viewer-zone middleware."""

import datetime as dt

import pytest
from django.test import Client

from config.errors import NotFound, NotPermitted
from reservations import selectors
from reservations.models import Membership, UserProfile
from tests.factories import make_job, make_reservation

SUBMITTED = dt.datetime(2031, 1, 15, 12, 0, tzinfo=dt.UTC)  # 13:00 in Berlin, 07:00 in New York


@pytest.mark.django_db
def test_who_may_change_a_booking_or_a_job(people, inventory):
    booking = make_reservation(user=people["owner"], team=people["vision"], gpus=inventory["a"][:1],
                               start=SUBMITTED, end=SUBMITTED + dt.timedelta(hours=1))
    job = make_job(user=people["owner"], team=people["vision"], submitted_at=SUBMITTED)
    for obj in (booking, job):
        allowed = {name for name in ("owner", "teammate", "manager", "outsider", "admin")
                   if selectors.can_change(user=people[name], obj=obj)}
        assert allowed == {"owner", "manager", "admin"}
        with pytest.raises(NotPermitted):
            selectors.require_can_change(user=people["teammate"], obj=obj, not_found="x", not_permitted="y")
        with pytest.raises(NotFound):  # not revealed outside the team
            selectors.require_can_change(user=people["outsider"], obj=obj, not_found="x", not_permitted="y")
    assert selectors.team_role(user=people["manager"], team_id=people["vision"].pk) == Membership.Role.MANAGER
    assert selectors.team_role(user=people["outsider"], team_id=people["vision"].pk) is None
    assert selectors.team_manager_ids(team_id=people["vision"].pk) == [people["manager"].pk]


def signed_in(user, zone: str | None) -> Client:
    if zone is not None:
        UserProfile.objects.update_or_create(user=user, defaults={"time_zone": zone})
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
@pytest.mark.parametrize(("zone", "shown"), [("Europe/Berlin", "13:00"), ("America/New_York", "07:00")])
def test_training_pages_show_times_in_the_viewer_zone(people, zone, shown):
    job = make_job(user=people["owner"], team=people["vision"], submitted_at=SUBMITTED)
    page = signed_in(people["owner"], zone).get(f"/jobs/{job.pk}/").content.decode()
    assert f"Wed 15 Jan 2031, {shown}" in page


@pytest.mark.django_db
def test_the_middleware_sets_and_activates_the_viewer_zone(people, rf):
    from django.contrib.auth.models import AnonymousUser
    from django.http import HttpResponse
    from django.utils import timezone

    from reservations.middleware import ViewerZoneMiddleware

    seen = {}

    def view(request):
        seen.update(viewer_zone=str(request.viewer_zone), active=timezone.get_current_timezone_name())
        return HttpResponse("ok")

    middleware = ViewerZoneMiddleware(view)
    UserProfile.objects.create(user=people["owner"], time_zone="Asia/Tokyo")
    for user, zone in ((people["owner"], "Asia/Tokyo"), (people["teammate"], "UTC"), (AnonymousUser(), "UTC")):
        request = rf.get("/")
        request.user = user
        middleware(request)
        assert seen == {"viewer_zone": zone, "active": zone}
