"""Real receivers on loopback: an SMTP server (aiosmtpd) and an HTTP webhook receiver that
checks every signature. Time is driven by passing `now`, never by sleeping."""

import datetime as dt
import email
import email.policy
import http.server
import json
import socket
import threading

import pytest
from aiosmtpd.controller import Controller

from notifications.transports.webhook.signing import verify

UTC = dt.UTC
NOW = dt.datetime(2027, 2, 1, 8, 0, tzinfo=UTC)
H = dt.timedelta(hours=1)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class SmtpSink:
    def __init__(self) -> None:
        self.messages: list[dict] = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append(
            {
                "from": envelope.mail_from,
                "to": list(envelope.rcpt_tos),
                "message": email.message_from_bytes(envelope.content, policy=email.policy.default),
            }
        )
        return "250 OK"


@pytest.fixture
def smtp(settings):
    """A real SMTP server on loopback; Django's SMTP backend points at it."""
    sink = SmtpSink()
    port = free_port()
    controller = Controller(sink, hostname="127.0.0.1", port=port)
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = "127.0.0.1"
    settings.EMAIL_PORT = port
    settings.EMAIL_USE_TLS = False
    settings.EMAIL_USE_SSL = False
    settings.EMAIL_HOST_USER = ""
    settings.EMAIL_HOST_PASSWORD = ""
    yield sink
    controller.stop()


class Receiver:
    """An HTTP endpoint that answers with the next scripted status (then 200 for ever) and
    records each request with whether its signature checked out."""

    def __init__(self, secret: str = "") -> None:
        self.secret = secret
        self.statuses: list[int] = []
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                headers = {key.lower(): value for key, value in self.headers.items()}
                with receiver.lock:
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                    receiver.requests.append(
                        {
                            "path": self.path,
                            "headers": headers,
                            "body": body,
                            "json": json.loads(body),
                            "signature_ok": verify(
                                secret=receiver.secret,
                                timestamp=headers.get("x-gpubook-timestamp", ""),
                                body=body,
                                signature=headers.get("x-gpubook-signature", ""),
                            ),
                            "status": status,
                        }
                    )
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(b"ok" if status < 300 else b"receiver says no")

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hooks/gpubook?source=test"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def delivery_ids(self) -> list[str]:
        return [request["headers"]["x-gpubook-delivery"] for request in self.requests]


@pytest.fixture
def loopback_allowed(settings):
    settings.GPUBOOK_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]


@pytest.fixture
def receivers(loopback_allowed):
    """Factory of receivers; all are shut down after the test."""
    started: list[Receiver] = []

    def start() -> Receiver:
        receiver = Receiver()
        started.append(receiver)
        return receiver

    yield start
    for receiver in started:
        receiver.close()


@pytest.fixture
def people_with_email(people):
    for name in ("owner", "teammate", "manager", "outsider", "admin"):
        user = people[name]
        user.email = f"{user.username}@example.org"
        user.save(update_fields=["email"])
    return people


def add_webhook(team, receiver: Receiver, **extra):
    from notifications.models import Webhook

    webhook = Webhook.objects.create(team=team, url=receiver.url, **extra)
    receiver.secret = webhook.secret
    return webhook


