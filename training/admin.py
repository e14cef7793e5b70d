"""Admin pages for the image catalog, training jobs and runs. Jobs and runs are written by the
services and the scheduler, so here they are for looking, searching and filtering; changing a
job's state by hand would bypass the rules (cancel it through the API or its page instead)."""

import datetime as dt

from django import forms
from django.contrib import admin
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone

from scheduler.sim.policies import POLICY_NAMES, policy_overrides
from training import whatif
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
    fk_name = "job"  # a job's own runs, not those stopped for it
    fields = ["id", "kind", "state", "node", "started_at", "ended_at", "reason"]
    readonly_fields = fields
    extra = 0
    show_change_link = True
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False


class WhatIfForm(forms.Form):
    days = forms.IntegerField(min_value=1, max_value=30, initial=30, help_text="How far back (at most 30 days).")
    policy = forms.ChoiceField(choices=[(name, name) for name in POLICY_NAMES], initial="gpubook")
    overrides = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 3, "cols": 50}),
        help_text="scheduler.Policy fields for the what-if row, one FIELD=VALUE a line, "
        "e.g. non_checkpointable_gap_factor=1",
    )

    def clean_overrides(self) -> dict[str, object]:
        try:
            return policy_overrides(self.cleaned_data["overrides"].split())
        except ValueError as error:
            raise forms.ValidationError(str(error)) from None


@admin.register(TrainingJob)
class TrainingJobAdmin(ReadOnlyAdmin):
    list_display = ["id", "name", "team", "user", "state", "priority", "gpus_needed", "reservation", "submitted_at"]
    list_filter = ["state", "priority", "team"]
    search_fields = ["name", "user__username", "team__name"]
    list_select_related = ["team", "user", "reservation"]
    date_hierarchy = "submitted_at"
    inlines = [RunInline]
    # Its object tools link the scheduler what-if (the scheduler's policy is set in the
    # server's settings, so this is the admin's place to try another before changing them).
    change_list_template = "admin/training/trainingjob/change_list.html"

    def get_urls(self):
        view = self.admin_site.admin_view(self.whatif_view)
        return [path("what-if/", view, name="training_trainingjob_whatif"), *super().get_urls()]

    def whatif_view(self, request):
        """The last days' jobs and bookings replayed under the current settings and another
        policy (`manage.py simulate --from-history`), at most `ADMIN_MAX_JOBS` queued jobs so
        a click stays seconds of work. A GET with the form's fields runs it: it changes
        nothing."""
        form = WhatIfForm(request.GET if "days" in request.GET else None)
        report = None
        if form.is_bound and form.is_valid():
            try:
                report = whatif.history_whatif(
                    now=timezone.now(), since=dt.timedelta(days=form.cleaned_data["days"]),
                    policy_name=form.cleaned_data["policy"], overrides=form.cleaned_data["overrides"],
                    max_jobs=whatif.ADMIN_MAX_JOBS,
                )
            except ValueError as error:  # e.g. no GPUs in the inventory yet
                form.add_error(None, str(error))
        command = "python manage.py simulate --from-history --since 30d --policy gpubook --set FIELD=VALUE"
        context = {
            **self.admin_site.each_context(request),
            "title": "Scheduler what-if on this server's history",
            "opts": self.model._meta,
            "form": form,
            "report": report,
            "command": command,
            "max_jobs": whatif.ADMIN_MAX_JOBS,
        }
        return TemplateResponse(request, "admin/training/whatif.html", context)


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
