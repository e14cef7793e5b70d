"""Admin: the delivery log (with resend), notices, team webhooks and user preferences.

Staff who are not superusers see and manage only the webhooks and deliveries of the teams
they manage; the API (notifications/api.py) is how non-staff team managers manage theirs."""

from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.utils import timezone

from config.errors import DomainError
from notifications import services
from notifications.models import Delivery, EventType, Notice, NotificationPreference, Webhook


def _managed_team_ids(user) -> list[int]:
    from reservations import selectors  # the one permission layer (see notifications.services)

    return selectors.managed_team_ids(user=user)


class DeliveryInline(admin.TabularInline):
    model = Delivery
    extra = 0
    can_delete = False
    fields = ["id", "channel", "target", "state", "attempts", "next_attempt_at", "last_error", "delivered_at"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Notice)
class NoticeAdmin(admin.ModelAdmin):
    list_display = ["occurred_at", "event_type", "team", "id"]
    list_filter = ["event_type", "team"]
    date_hierarchy = "occurred_at"
    readonly_fields = ["id", "event_type", "team", "occurred_at", "payload", "dedupe_key"]
    inlines = [DeliveryInline]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def get_queryset(self, request):
        queryset = super().get_queryset(request).select_related("team")
        if request.user.is_superuser:
            return queryset
        return queryset.filter(team_id__in=_managed_team_ids(request.user))


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    """The delivery log. Failed rows stay here until resent."""

    list_display = ["created_at", "event_type", "channel", "target", "state", "attempts", "next_attempt_at",
                    "short_error"]
    list_filter = ["state", "channel", "notice__event_type", "notice__team"]
    search_fields = ["target", "id", "notice__id", "last_error"]
    list_select_related = ["notice"]
    readonly_fields = ["id", "notice", "channel", "user", "webhook", "target", "state", "attempts",
                       "attempts_before_resend", "next_attempt_at", "last_error", "created_at", "delivered_at"]
    actions = ["resend"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return request.user.is_superuser

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        if request.user.is_superuser:
            return queryset
        return queryset.filter(notice__team_id__in=_managed_team_ids(request.user))

    @admin.display(description="Event", ordering="notice__event_type")
    def event_type(self, delivery: Delivery) -> str:
        return delivery.notice.event_type

    @admin.display(description="Last error")
    def short_error(self, delivery: Delivery) -> str:
        return delivery.last_error[:80]

    @admin.action(description="Resend selected deliveries (same delivery id)")
    def resend(self, request, queryset):
        count = services.delivery_resend(delivery_ids=queryset.values_list("pk", flat=True), now=timezone.now())
        skipped = queryset.count() - count
        self.message_user(request, f"{count} delivery(ies) queued again; the next loop run sends them.")
        if skipped:
            self.message_user(request, f"{skipped} still pending or being sent were left alone.", messages.WARNING)


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    list_display = ["team", "url", "enabled", "events_summary", "created_at"]
    list_filter = ["enabled", "team"]
    search_fields = ["url", "description", "team__name"]
    readonly_fields = ["created_by", "created_at"]
    fields = ["team", "url", "description", "events", "enabled", "secret", "created_by", "created_at"]

    @admin.display(description="Events")
    def events_summary(self, webhook: Webhook) -> str:
        return ", ".join(webhook.events) or "all"

    def get_queryset(self, request):
        queryset = super().get_queryset(request).select_related("team")
        if request.user.is_superuser:
            return queryset
        return queryset.filter(team_id__in=_managed_team_ids(request.user))

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        if db_field.name == "url":
            kwargs["assume_scheme"] = "https"
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        field = super().formfield_for_foreignkey(db_field, request, **kwargs)
        if db_field.name == "team" and not request.user.is_superuser:
            field.queryset = field.queryset.filter(pk__in=_managed_team_ids(request.user))
        return field

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change, **kwargs)
        valid = set(EventType.values)

        def clean(form_self):
            data = super(form, form_self).clean()
            url, events = data.get("url"), data.get("events") or []
            if url:
                try:
                    services.webhook_check_url(url)
                except DomainError as error:
                    raise ValidationError({"url": error.detail}) from None
            if not isinstance(events, list) or not set(events) <= valid:
                raise ValidationError({"events": f"A list of event types, empty for all: {', '.join(sorted(valid))}"})
            return data

        return type(form.__name__, (form,), {"clean": clean})

    def save_model(self, request, obj, form, change):
        if not change:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)


@admin.register(NotificationPreference)
class NotificationPreferenceAdmin(admin.ModelAdmin):
    list_display = ["user", "email_enabled", "muted_events"]
    list_filter = ["email_enabled"]
    search_fields = ["user__username", "user__email"]
    autocomplete_fields = ["user"]
