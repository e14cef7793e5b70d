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
    """Reservation payloads carry GPUs as {"id", "index"}; run and idle payloads as plain GPU
    ids (integers). Both read as a list; anything else is shown as it is, never raised on."""
    names = []
    for gpu in gpus if isinstance(gpus, list) else []:
        if isinstance(gpu, dict):
            names.append(f"GPU {gpu.get('index', gpu.get('id'))}")
        elif isinstance(gpu, int) and not isinstance(gpu, bool):
            names.append(f"GPU #{gpu}")
        else:
            names.append(str(gpu))
    return ", ".join(names)
