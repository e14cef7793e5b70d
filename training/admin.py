"""Admin pages for the image catalog, training jobs and runs. Jobs and runs are written by the
services and the scheduler, so here they are for looking, searching and filtering; changing a
job's state by hand would bypass the rules (cancel it through the API or its page instead)."""

from django.contrib import admin

from training.models import Artifact, Run, RunMetric, TrainingImage, TrainingJob


@admin.register(TrainingImage)
class TrainingImageAdmin(admin.ModelAdmin):
    """The trainer image catalog. Tags are what job specs name; the digest is what runs pull
    (repository@sha256:…), set by `manage.py images pin` from the registry."""

    list_display = ["name", "tag", "digest_or_unpinned", "pinned_at", "allowed", "description"]
    list_filter = ["allowed", "name"]
    search_fields = ["name", "tag", "digest", "description"]
    readonly_fields = ["pinned_reference", "pinned_at"]
    fields = [
        "name", "tag", "digest", "pinned_reference", "pinned_at", "allowed", "description", "framework_versions",
        "default_hyperparameters", "recommended_batch",
    ]

    @admin.display(description="digest", ordering="digest")
    def digest_or_unpinned(self, image: TrainingImage) -> str:
        return image.digest or "not pinned (runs pull the tag)"

    @admin.display(description="runs pull")
    def pinned_reference(self, image: TrainingImage) -> str:
        return image.pinned_reference

    def save_model(self, request, obj: TrainingImage, form, change: bool) -> None:
        # A new tag points at another manifest: the old digest would run the old image.
        if change and "tag" in form.changed_data and "digest" not in form.changed_data:
            obj.digest, obj.pinned_at = "", None
        super().save_model(request, obj, form, change)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Everything visible, nothing editable: these rows are the scheduler's record."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


class RunInline(admin.TabularInline):
    model = Run
    fields = ["id", "kind", "state", "node", "started_at", "ended_at", "reason"]
    readonly_fields = fields
    extra = 0
    show_change_link = True
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(TrainingJob)
class TrainingJobAdmin(ReadOnlyAdmin):
    list_display = ["id", "name", "team", "user", "state", "priority", "gpus_needed", "reservation", "submitted_at"]
    list_filter = ["state", "priority", "team"]
    search_fields = ["name", "user__username", "team__name"]
    list_select_related = ["team", "user", "reservation"]
    date_hierarchy = "submitted_at"
    inlines = [RunInline]


class ArtifactInline(admin.TabularInline):
    model = Artifact
    fields = ["name", "path", "size_bytes", "sha256", "created_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ["id", "job", "kind", "state", "node", "started_at", "ended_at", "must_end_by", "exit_code"]
    list_filter = ["state", "kind", "node"]
    search_fields = ["job__name", "job__user__username", "reason"]
    list_select_related = ["job", "node"]
    date_hierarchy = "created_at"
    exclude = ["report_token_hash"]  # a credential's hash is nobody's business on a page
    inlines = [ArtifactInline]


@admin.register(RunMetric)
class RunMetricAdmin(ReadOnlyAdmin):
    list_display = ["run", "event", "epoch", "at"]
    list_filter = ["event"]
    list_select_related = ["run"]
