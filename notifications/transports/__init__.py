"""Notification channels, one folder each, all with the same shape (STYLE.md habit 10).

A transport is an object with `channel` (a Delivery.Channel value) and `send(delivery)`. It
sends one delivery, returns on success and raises `TransportError` (try again later) or
`PermanentError` (retrying cannot help) otherwise. Transports never touch the database;
the delivery loop records the outcome.
"""

from django.utils.module_loading import import_string


class TransportError(Exception):
    """The attempt failed; a later attempt may succeed (receiver down, timeout, SMTP 4xx)."""


class PermanentError(TransportError):
    """Retrying cannot help (the endpoint was disabled, the URL is refused)."""


# Imported on first use, so loading the registry never drags in every transport's libraries.
REGISTRY = {
    "email": "notifications.transports.email.EmailTransport",
    "webhook": "notifications.transports.webhook.WebhookTransport",
}
_loaded: dict[str, object] = {}


def transport_for(channel: str):
    if channel not in _loaded:
        _loaded[channel] = import_string(REGISTRY[channel])()
    return _loaded[channel]
