from django.contrib import admin

from gpus.models import Gpu, MaintenanceWindow, Node, NodeAgentToken


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "description", "gpu_count"]
    search_fields = ["name"]
    inlines = [GpuInline]

    @admin.display(description="GPUs")
    def gpu_count(self, node: Node) -> int:
        return node.gpus.count()


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["__str__", "model_name", "memory_mib", "state", "uuid"]
    list_filter = ["state", "node", "model_name"]
    search_fields = ["uuid", "node__name", "model_name"]
    list_select_related = ["node"]


@admin.register(MaintenanceWindow)
class MaintenanceWindowAdmin(admin.ModelAdmin):
    list_display = ["node", "start", "end", "reason"]
    list_filter = ["node"]
    filter_horizontal = ["gpus"]


@admin.register(NodeAgentToken)
class NodeAgentTokenAdmin(admin.ModelAdmin):
    """Agent tokens are issued by `manage.py gpu_agent`; here they are seen and revoked."""

    list_display = ["node", "description", "created_at", "last_used_at", "revoked"]
    list_filter = ["revoked", "node"]
    readonly_fields = ["node", "token_hash", "description", "created_at", "last_used_at"]
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        return False

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset):
        self.message_user(request, f"Revoked {queryset.update(revoked=True)} token(s).")
