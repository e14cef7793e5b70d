from django.contrib import admin, messages
from django.utils import timezone
from django.utils.html import format_html

from config.errors import DomainError
from reservations import selectors, services
from reservations.models import AuditEntry, Membership, Reservation, ReservationGpu, Team, UserProfile


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["name", "monthly_gpu_hours", "quota_bar", "time_zone", "requires_approval"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]

    # The bar's colours, by QuotaPosition.level (the same lines as the calendar bar).
    LEVEL_COLOURS = {"ok": "#2e7d32", "warning": "#ef6c00", "exhausted": "#c62828"}

    @admin.display(description="Used this month")
    def quota_bar(self, team: Team) -> str:
        position = selectors.team_quota_position(team=team, now=timezone.now())
        used = round(position.used_gpu_hours, 2)
        quota = team.monthly_gpu_hours
        return format_html(
            '<div style="width:160px;background:#e0e0e0;border-radius:3px" '
            'title="{} of {} GPU-hours ({} by backfill)">'
            '<div style="width:{}%;background:{};height:10px;border-radius:3px"></div></div>'
            "{} / {} GPU-h",
            used, quota, round(position.backfill_gpu_hours, 2), position.percent, self.LEVEL_COLOURS[position.level],
            used, quota,
        )


class ReservationGpuInline(admin.TabularInline):
    model = ReservationGpu
    extra = 0
    can_delete = False
    readonly_fields = ["gpu", "start", "end", "occupies"]

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Reservation)
class ReservationAdmin(admin.ModelAdmin):
    """Read-mostly: bookings change only through the services (overlap, quota, audit)."""

    list_display = ["id", "team", "user", "node", "gpu_count", "start", "end", "status"]
    list_filter = ["status", "team", "node"]
    search_fields = ["note", "user__username", "team__name"]
    date_hierarchy = "start"
    list_select_related = ["team", "user", "node"]
    readonly_fields = [
        "user", "team", "node", "gpu_count", "start", "end", "status", "release_reason",
        "created_at", "updated_at",
    ]
    fields = [*readonly_fields, "note"]
    inlines = [ReservationGpuInline]
    actions = ["cancel_selected", "release_selected"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def _apply(self, request, queryset, service, verb: str) -> None:
        done = 0
        for reservation in queryset:
            try:
                service(reservation_id=reservation.pk, actor=request.user, now=timezone.now(),
                        reason=f"{verb} by admin {request.user.username}")
                done += 1
            except DomainError as error:
                self.message_user(request, f"#{reservation.pk}: {error.detail}", messages.WARNING)
        self.message_user(request, f"{done} reservation(s) {verb}.")

    @admin.action(description="Cancel selected reservations (refunds quota)")
    def cancel_selected(self, request, queryset):
        self._apply(request, queryset, services.reservation_cancel, "cancelled")

    @admin.action(description="Release selected reservations early")
    def release_selected(self, request, queryset):
        self._apply(request, queryset, services.reservation_release, "released")


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    list_display = ["at", "actor", "action", "reservation", "team"]
    list_filter = ["action"]
    readonly_fields = ["at", "actor", "action", "reservation", "team", "before", "after"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(UserProfile)
class UserProfileAdmin(admin.ModelAdmin):
    list_display = ["user", "time_zone"]
    exclude = ["calendar_token"]
