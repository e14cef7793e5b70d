"""Writes to a user's own profile: time zone and the secret iCal token.

Kept apart from services.py (the booking rules) because nothing here touches bookings or
quotas; the same conventions hold: keyword-only arguments, `now` passed in, DomainError out.
"""

import datetime as dt

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from config.errors import DomainError, ErrorCode
from reservations.models import AuditEntry, UserProfile, new_calendar_token, validate_time_zone


def profile_get_or_create(*, user: AbstractBaseUser) -> UserProfile:
    """The user's profile, made on first use with the site's default time zone."""
    profile = UserProfile.objects.filter(user=user).first()
    if profile is not None:
        return profile
    try:
        with transaction.atomic():
            return UserProfile.objects.create(user=user, time_zone=settings.TIME_ZONE)
    except IntegrityError:  # two first requests at once: the other one made it
        return UserProfile.objects.get(user=user)


def profile_update_time_zone(*, user: AbstractBaseUser, time_zone: str, now: dt.datetime) -> UserProfile:
    try:
        validate_time_zone(time_zone)
    except ValidationError:
        raise DomainError(ErrorCode.UNKNOWN_TIME_ZONE, f"{time_zone!r} is not a known time zone.") from None
    profile = profile_get_or_create(user=user)
    before = profile.time_zone
    profile.time_zone = time_zone
    profile.save(update_fields=["time_zone"])
    AuditEntry.objects.create(
        actor=user, at=now, action="profile_time_zone", before={"time_zone": before}, after={"time_zone": time_zone}
    )
    return profile


def profile_regenerate_calendar_token(*, user: AbstractBaseUser, now: dt.datetime) -> UserProfile:
    """A new secret for the iCal URL; the old URL stops working at once."""
    profile = profile_get_or_create(user=user)
    profile.calendar_token = new_calendar_token()
    profile.save(update_fields=["calendar_token"])
    # The audit row says that it happened, never the token itself.
    AuditEntry.objects.create(actor=user, at=now, action="profile_calendar_token", before=None, after=None)
    return profile
