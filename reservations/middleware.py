"""The viewer's time zone, found once per request for every page (booking pages, reports,
training pages, admin): `request.viewer_zone` is the signed-in user's zone
(UserProfile.time_zone; the site's TIME_ZONE until they have a profile), UTC for anyone
else, and it is the active zone while the request runs, so templates' dates show in it.
`request.profile` is the profile when there is one (pages that need it make it)."""

import zoneinfo

from django.conf import settings
from django.utils import timezone

from reservations.models import UserProfile


class ViewerZoneMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request.profile = None
        zone_name = "UTC"
        if request.user.is_authenticated:
            request.profile = UserProfile.objects.filter(user=request.user).first()
            zone_name = request.profile.time_zone if request.profile is not None else settings.TIME_ZONE
        try:
            request.viewer_zone = zoneinfo.ZoneInfo(zone_name)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):  # a zone that has left the tz database
            request.viewer_zone = zoneinfo.ZoneInfo("UTC")
        with timezone.override(request.viewer_zone):
            return self.get_response(request)
