"""Issue, authenticate and revoke API tokens (accounts/models.py says what is stored)."""

import datetime as dt
import hmac
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from accounts.models import PREFIX_LENGTH, ApiToken, hash_key
from config.batch import columns, fetch_prepared, instance_from_row
from config.errors import ErrorCode, NotFound


def _fingerprint(user: AbstractBaseUser) -> str:
    return user.get_session_auth_hash()


def api_token_issue(*, user: AbstractBaseUser, now: dt.datetime, name: str = "") -> tuple[ApiToken, str]:
    """A new token; the key is returned once and never stored."""
    key = "gpb_" + secrets.token_urlsafe(32)
    days = settings.GPUBOOK_API_TOKEN_DAYS
    token = ApiToken.objects.create(
        user=user, name=name[:100], key_prefix=key[:PREFIX_LENGTH], key_hash=hash_key(key),
        password_fingerprint=_fingerprint(user), created_at=now,
        expires_at=now + dt.timedelta(days=days) if days else None,
    )
    return token, key


def api_token_user(*, key: str, now: dt.datetime) -> tuple[AbstractBaseUser, ApiToken] | None:
    """The (active) user a live key belongs to, or None for any dead or unknown key."""
    if not key or len(key) > 200:
        return None
    token = _live_token(key_hash=hash_key(key))
    if token is None or (token.expires_at is not None and token.expires_at <= now) or not token.user.is_active:
        return None
    if not hmac.compare_digest(token.password_fingerprint, _fingerprint(token.user)):
        ApiToken.objects.filter(pk=token.pk, revoked_at=None).update(revoked_at=now)  # the password changed
        return None
    if token.last_used_at is None or now - token.last_used_at > dt.timedelta(minutes=1):
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.user, token


def _live_token(*, key_hash: str) -> ApiToken | None:
    """The unrevoked token with this hash, with its user: read on every API request, so its
    statement is built once (`fetch_prepared`)."""
    user_model = get_user_model()

    def build(values: dict) -> list[QuerySet]:
        return [
            ApiToken.objects.filter(key_hash=values["key_hash"], revoked_at=None)
            .values(*columns(ApiToken), *columns(user_model, "user__"))[:1]
        ]

    (rows,) = fetch_prepared(key="api_token_user", build=build, values={"key_hash": key_hash})
    if not rows:
        return None
    token = instance_from_row(ApiToken, rows[0])
    token.user = instance_from_row(user_model, rows[0], "user__")
    return token


def api_tokens_of(*, user: AbstractBaseUser):
    return ApiToken.objects.filter(user=user, revoked_at=None)


def api_token_revoke(*, user: AbstractBaseUser, token_id: int, now: dt.datetime) -> ApiToken:
    """Revoke one of `user`'s own tokens; anyone else's is 'not found'."""
    token = ApiToken.objects.filter(pk=token_id, user=user, revoked_at=None).first()
    if token is None:
        raise NotFound(ErrorCode.NOT_FOUND, "Not found.")
    token.revoked_at = now
    token.save(update_fields=["revoked_at"])
    return token
