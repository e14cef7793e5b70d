from django.contrib import admin
from django.utils import timezone

from accounts.models import ApiToken, ExternalIdentity


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["key_prefix", "user", "name", "created_at", "last_used_at", "expires_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["user__username", "key_prefix", "name"]
    readonly_fields = ["user", "key_prefix", "key_hash", "password_fingerprint", "created_at", "last_used_at"]
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        return False  # keys are issued through the API, shown once

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset):
        count = queryset.filter(revoked_at=None).update(revoked_at=timezone.now())
        self.message_user(request, f"Revoked {count} token(s).")


@admin.register(ExternalIdentity)
class ExternalIdentityAdmin(admin.ModelAdmin):
    """Single sign-on links. Adding one by hand lets a provider account sign in as an existing
    local user (accounts never link by e-mail on their own)."""

    list_display = ["user", "issuer", "subject", "created_at", "last_login_at"]
    search_fields = ["user__username", "subject", "issuer"]
    raw_id_fields = ["user"]
