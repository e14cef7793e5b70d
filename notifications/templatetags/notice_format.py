"""Filters for notice emails: payload times are ISO-8601 UTC; people read them locally."""

import datetime as dt
import zoneinfo

from django import template

register = template.Library()


@register.filter
def local_time(value: str, zone: str) -> str:
    """'2026-06-01T08:00:00+00:00' |local_time:'Europe/Berlin' → 'Mon 1 Jun 2026, 10:00 CEST'."""
    if not value:
        return ""
    try:
        moment = dt.datetime.fromisoformat(value).astimezone(zoneinfo.ZoneInfo(zone or "UTC"))
    except (TypeError, ValueError, zoneinfo.ZoneInfoNotFoundError):
        return str(value)
    return f"{moment:%a} {moment.day} {moment:%b %Y, %H:%M} {moment.tzname()}"


@register.filter
def gpu_list(gpus: list) -> str:
    return ", ".join(f"GPU {gpu.get('index', gpu.get('id'))}" for gpu in gpus or [])
