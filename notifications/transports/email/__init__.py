"""Email transport: one message per delivery through Django's mail framework (SMTP in
production, the console backend in `make run`), with plain-text and HTML bodies rendered from
templates/notifications/email/, times shown in the recipient's time zone, and links back."""

import smtplib
import zoneinfo

from django.conf import settings
from django.core.mail import EmailMultiAlternatives, get_connection
from django.template.loader import render_to_string

from notifications import links
from notifications.models import EventType
from notifications.transports import PermanentError, TransportError

# Event types share a body template per family: reservation.*, run.*, quota.*, job.*.
FAMILIES = ("reservation", "run", "quota", "job", "waitlist")


def _recipient_zone(user) -> str:
    profile = getattr(user, "profile", None)  # reservations.UserProfile, when there is one
    zone = getattr(profile, "time_zone", "") or "UTC"
    try:
        zoneinfo.ZoneInfo(zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return "UTC"
    return zone


def email_context(notice, user) -> dict:
    payload = notice.payload
    return {
        "event_type": notice.event_type,
        "title": EventType(notice.event_type).label,
        "payload": payload,
        "user": user,
        "time_zone": _recipient_zone(user),
        "url": payload.get("url") or links.base_url(),
        "preferences_url": links.preferences_url(),
        "site_url": links.base_url(),
    }


def render_email(notice, user) -> tuple[str, str, str]:
    """(subject, text, html) for `notice` as `user` should read it."""
    family = notice.event_type.split(".", 1)[0]
    if family not in FAMILIES:
        raise PermanentError(f"no email template for {notice.event_type}")
    context = email_context(notice, user)
    subject = " ".join(render_to_string("notifications/email/subject.txt", context).split())
    text = render_to_string(f"notifications/email/{family}.txt", context)
    html = render_to_string(f"notifications/email/{family}.html", context)
    return subject, text, html


class EmailTransport:
    channel = "email"

    def send(self, delivery) -> None:
        user = delivery.user
        address = (user.email if user is not None else "") or delivery.target
        if not address:
            raise PermanentError("the recipient has no email address")
        subject, text, html = render_email(delivery.notice, user)
        timeout = settings.EMAIL_TIMEOUT
        message = EmailMultiAlternatives(
            subject=subject,
            body=text,
            from_email=settings.DEFAULT_FROM_EMAIL,
            to=[address],
            headers={"X-Gpubook-Delivery": str(delivery.pk), "X-Gpubook-Event": delivery.notice.event_type},
            connection=get_connection(timeout=timeout),
        )
        message.attach_alternative(html, "text/html")
        try:
            message.send(fail_silently=False)
        except smtplib.SMTPRecipientsRefused as error:
            raise PermanentError(f"recipient refused: {error.recipients}") from None
        except (smtplib.SMTPException, OSError) as error:
            raise TransportError(f"{type(error).__name__}: {error}") from None
