"""Move DRF authtoken keys (stored in plain text) into ApiToken (stored hashed), then delete
the plain rows. Existing clients keep working until the copy expires like any new token."""

import datetime as dt
import hashlib

from django.conf import settings
from django.db import migrations
from django.utils import timezone
from django.utils.crypto import salted_hmac

SESSION_HASH_SALT = "django.contrib.auth.models.AbstractBaseUser.get_session_auth_hash"


def move(apps, schema_editor):
    Token = apps.get_model("authtoken", "Token")
    ApiToken = apps.get_model("accounts", "ApiToken")
    now = timezone.now()
    days = settings.GPUBOOK_API_TOKEN_DAYS
    for old in Token.objects.select_related("user"):
        ApiToken.objects.get_or_create(
            key_hash=hashlib.sha256(old.key.encode()).hexdigest(),
            defaults={
                "user": old.user, "name": "moved from the old token table", "key_prefix": old.key[:8],
                # as AbstractBaseUser.get_session_auth_hash() computes it
                "password_fingerprint": salted_hmac(SESSION_HASH_SALT, old.user.password,
                                                    algorithm="sha256").hexdigest(),
                "created_at": old.created, "expires_at": now + dt.timedelta(days=days) if days else None,
            },
        )
    Token.objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0001_initial"),
        ("authtoken", "0004_alter_tokenproxy_options"),
    ]

    operations = [migrations.RunPython(move, migrations.RunPython.noop)]
