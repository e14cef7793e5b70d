from django.contrib import admin

from training.models import TrainingImage


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
