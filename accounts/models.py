"""API tokens: what a CLI or a script sends as `Authorization: Token <key>`.

Only a SHA-256 of each key is stored (a copy of the database gives no credential); the first
characters are kept to tell tokens apart in a list. A token is dead once revoked, once past
its expiry, or once its user's password changes (it remembers the password's fingerprint, as
Django's sessions do)."""

import hashlib

from django.conf import settings
from django.db import models
from django.utils import timezone

PREFIX_LENGTH = 8


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "replace")).hexdigest()


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    key_prefix = models.CharField(max_length=PREFIX_LENGTH)
    key_hash = models.CharField(max_length=64, unique=True)
    # Django's session auth hash of the user at issue time: a password change invalidates it.
    password_fingerprint = models.CharField(max_length=128)
    created_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.key_prefix}… of {self.user}"


class ExternalIdentity(models.Model):
    """A user's account at an OpenID Provider (single sign-on, accounts/oidc.py): the provider's
    issuer and its stable subject identifier. A returning sign-in finds its user here, never by
    e-mail: an account at the provider must not take over a local account that shares an address."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="external_identities")
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(default=timezone.now)  # default: a link an administrator adds
    last_login_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="external_identity_unique")]
        verbose_name_plural = "external identities"

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer} → {self.user}"
