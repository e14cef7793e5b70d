"""The webhook signature: HMAC-SHA256 over `timestamp + "." + body` with the endpoint's
secret, sent as `X-Gpubook-Signature: sha256=<hex>`. docs/webhooks.md shows the receiver's
side; `verify` here is the same check, used by the tests' receiver."""

import hashlib
import hmac


def sign(*, secret: str, timestamp: str, body: bytes) -> str:
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify(*, secret: str, timestamp: str, body: bytes, signature: str) -> bool:
    return hmac.compare_digest(sign(secret=secret, timestamp=timestamp, body=body), signature)
