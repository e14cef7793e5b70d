from django.contrib import admin

from gpus.models import Gpu, MaintenanceWindow, Node


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
