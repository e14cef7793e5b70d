"""The per-user iCal feed (RFC 5545): a secret URL that calendar apps subscribe to.

The token in the URL is the only credential, so the feed holds exactly one user's own
bookings and nothing that names anyone else. Times are UTC ("Z" form), which every client
reads without needing a VTIMEZONE block.
"""

import datetime as dt

import icalendar
from django.db.models import Prefetch

from reservations.models import Reservation, ReservationGpu, UserProfile

PAST_DAYS = 90
PRODID = "-//gpubook//GPU reservations//EN"
STATUS_MAP = {
    Reservation.Status.PENDING: "TENTATIVE",
    Reservation.Status.CONFIRMED: "CONFIRMED",
    Reservation.Status.ACTIVE: "CONFIRMED",
    Reservation.Status.COMPLETED: "CONFIRMED",
    Reservation.Status.RELEASED: "CONFIRMED",
}


def ical_feed_for_token(*, token: str, now: dt.datetime, base_url: str) -> bytes | None:
    """The feed for the profile holding `token`, or None when no profile does."""
    if not token:
        return None
    profile = UserProfile.objects.select_related("user").filter(calendar_token=token).first()
    if profile is None:
        return None
    user = profile.user
    reservations = (
        Reservation.objects.filter(
            user=user, status__in=Reservation.OCCUPYING, end__gt=now - dt.timedelta(days=PAST_DAYS)
        )
        .select_related("team", "node")
        .prefetch_related(
            Prefetch("booked", queryset=ReservationGpu.objects.select_related("gpu").order_by("gpu__index"))
        )
        .order_by("start", "id")
    )
    calendar = icalendar.Calendar()
    calendar.add("prodid", PRODID)
    calendar.add("version", "2.0")
    calendar.add("calscale", "GREGORIAN")
    calendar.add("method", "PUBLISH")
    calendar.add("x-wr-calname", f"gpubook — {user.get_username()}")
    calendar.add("x-published-ttl", dt.timedelta(minutes=15))
    calendar.add("refresh-interval", dt.timedelta(minutes=15), parameters={"VALUE": "DURATION"})
    for reservation in reservations:
        gpus = [row.gpu for row in reservation.booked.all()]
        indexes = ", ".join(str(gpu.index) for gpu in gpus)
        models = sorted({gpu.model_name for gpu in gpus})
        event = icalendar.Event()
        event.add("uid", f"reservation-{reservation.pk}@gpubook")
        event.add("dtstamp", now.astimezone(dt.UTC))
        event.add("last-modified", reservation.updated_at.astimezone(dt.UTC))
        event.add("created", reservation.created_at.astimezone(dt.UTC))
        event.add("dtstart", reservation.start.astimezone(dt.UTC))
        event.add("dtend", reservation.end.astimezone(dt.UTC))
        gpu_word = "GPU" if len(gpus) == 1 else "GPUs"
        event.add("summary", f"{reservation.node.name} {gpu_word} {indexes} ({reservation.team.name})")
        event.add("location", reservation.node.name)
        lines = [
            f"Team: {reservation.team.name}",
            f"GPUs: {reservation.node.name} {indexes} ({', '.join(models)})",
            f"Status: {reservation.get_status_display()}",
        ]
        if reservation.note:
            lines.append(f"Note: {reservation.note}")
        event.add("description", "\n".join(lines))
        event.add("status", STATUS_MAP.get(reservation.status, "CONFIRMED"))
        event.add("url", f"{base_url}/reservations/{reservation.pk}/")
        event.add("transp", "OPAQUE")
        calendar.add_component(event)
    return calendar.to_ical()
