"""Webhook transport: a signed JSON POST to a team's endpoint.

Body: {"id": notice id, "type": event type, "time": ISO-8601, "payload": {...}}.
Headers: X-Gpubook-Delivery (stable across retries: de-duplicate on it), X-Gpubook-Timestamp
(Unix seconds), X-Gpubook-Signature (see signing.py). Any 2xx is success; anything else, a
timeout or a refused connection is retried by the delivery loop. Redirects are not followed.
"""

import http.client
import json
import socket
import ssl
import time

from django.conf import settings

from notifications.transports import PermanentError, TransportError
from notifications.transports.webhook.signing import sign
from notifications.transports.webhook.targets import Target, UnresolvableTarget, UnsafeTarget, check_url

USER_AGENT = "gpubook-webhooks/1"


def webhook_body(notice) -> bytes:
    document = {
        "id": str(notice.pk),
        "type": notice.event_type,
        "time": notice.occurred_at.isoformat(),
        "payload": notice.payload,
    }
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects to the vetted address while the Host header keeps the name."""

    def __init__(self, target: Target, timeout: float) -> None:
        super().__init__(target.host, target.port, timeout=timeout)
        self._address = target.address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, target: Target, timeout: float) -> None:
        super().__init__(target.host, target.port, timeout=timeout, context=ssl.create_default_context())
        self._address = target.address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        # certificate and SNI are checked against the host name, not the address
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def post(target: Target, body: bytes, headers: dict[str, str], timeout: float) -> tuple[int, bytes]:
    connection_class = _PinnedHTTPSConnection if target.scheme == "https" else _PinnedHTTPConnection
    connection = connection_class(target, timeout)
    try:
        connection.request("POST", target.path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read(2048)
    finally:
        connection.close()


class WebhookTransport:
    channel = "webhook"

    def send(self, delivery) -> None:
        webhook = delivery.webhook
        if webhook is None:
            raise PermanentError("the webhook was removed")
        if not webhook.enabled:
            raise PermanentError("the webhook is disabled")
        try:
            target = check_url(webhook.url)
        except UnsafeTarget as error:
            raise PermanentError(str(error)) from None
        except UnresolvableTarget as error:
            raise TransportError(str(error)) from None
        body = webhook_body(delivery.notice)
        timestamp = str(int(time.time()))  # the receiver compares it with its own clock
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "X-Gpubook-Delivery": str(delivery.pk),
            "X-Gpubook-Event": delivery.notice.event_type,
            "X-Gpubook-Timestamp": timestamp,
            "X-Gpubook-Signature": sign(secret=webhook.secret, timestamp=timestamp, body=body),
        }
        timeout = settings.GPUBOOK_WEBHOOK_TIMEOUT_SECONDS
        try:
            status, content = post(target, body, headers, timeout)
        except (OSError, http.client.HTTPException) as error:
            raise TransportError(f"{type(error).__name__}: {error}") from None
        if not 200 <= status < 300:
            snippet = content.decode("utf-8", "replace").strip()[:200]
            raise TransportError(f"HTTP {status}" + (f": {snippet}" if snippet else ""))
