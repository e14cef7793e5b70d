import hashlib
import secrets

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q

import scheduler
from gpus.models import Node
from reservations.models import Reservation, Team


class TrainingImage(models.Model):
    """An allowlisted trainer image. Only images listed here (and allowed) may run."""

    name = models.CharField(max_length=100, help_text="Repository, e.g. yolo")
    tag = models.CharField(max_length=100, help_text="e.g. v8n-cu118")
    description = models.CharField(max_length=200, blank=True)
    framework_versions = models.JSONField(default=dict, blank=True)
    default_hyperparameters = models.JSONField(default=dict, blank=True)
    # {"<GPU memory MiB at least>": batch size}: the largest key not above the GPU's memory wins.
    recommended_batch = models.JSONField(default=dict, blank=True)
    allowed = models.BooleanField(default=True)
    # The manifest digest the tag pointed to when an admin pinned it (`manage.py images pin`).
    # Runs use name@digest, so retagging the image in the registry cannot change what runs.
    digest = models.CharField(
        max_length=71, blank=True, validators=[RegexValidator(r"^sha256:[0-9a-f]{64}$", "sha256:<64 hex digits>")],
        help_text="sha256:… of the image manifest; empty until pinned.",
    )
    pinned_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name", "tag"]
        constraints = [models.UniqueConstraint(fields=["name", "tag"], name="trainingimage_unique_name_tag")]

    def __str__(self) -> str:
        return self.reference

    @property
    def reference(self) -> str:
        """What job specs name: repository:tag."""
        return f"{self.name}:{self.tag}"

    @property
    def pinned_reference(self) -> str:
        """What runs pull: repository@sha256:… once pinned, the tag until then."""
        return f"{self.name}@{self.digest}" if self.digest else self.reference

    def batch_for(self, memory_mib: int) -> int | None:
        fitting = [(int(limit), batch) for limit, batch in self.recommended_batch.items() if int(limit) <= memory_mib]
        return max(fitting)[1] if fitting else None


# The priority classes are the scheduling core's (scheduler.Priority), defined once there.
Priority = models.TextChoices("Priority", [(member.name, (member.value, member.value.title())) for member in
                                            scheduler.Priority])


class Then(models.TextChoices):
    NEXT_BOOKING = "next_booking", "Continue in my next booking"
    BACKFILL = "backfill", "Join the queue"
    HOLD = "hold", "Wait for me"


class WaitingFor(models.TextChoices):
    SLOT = "", "Its booking or idle GPUs"  # the normal case: attached, or in the backfill queue
    BOOKING = "booking", "Its owner's next booking"
    USER = "user", "Its owner (held)"


class TrainingJob(models.Model):
    """What to run. Attached to a reservation (runs in its slots) or queued (backfill)."""

    class State(models.TextChoices):
        QUEUED = "queued", "Waiting"  # for its slot, or for idle GPUs
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    FINISHED = (State.SUCCEEDED, State.FAILED, State.CANCELLED)

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="jobs")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=200)
    image = models.ForeignKey(TrainingImage, on_delete=models.PROTECT, related_name="jobs")
    spec = models.JSONField(help_text="The validated job spec as submitted.")
    # The parsed spec with its defaults filled in (jobspec.JobSpec.as_dict()); launch reads this,
    # never the raw document, so a default lives only in the parser.
    parsed_spec = models.JSONField(default=dict, blank=True, help_text="The normalized job spec.")
    argv = models.JSONField(default=list, blank=True, help_text="Explicit command (argv list), if any.")
    gpus_needed = models.PositiveSmallIntegerField(default=1)
    priority = models.CharField(max_length=8, choices=Priority.choices, default=Priority.MEDIUM)
    timeout_s = models.PositiveIntegerField(null=True, blank=True)
    estimated_duration_s = models.PositiveIntegerField(null=True, blank=True)
    checkpointable = models.BooleanField(default=True)
    reservation = models.ForeignKey(
        Reservation, null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    state = models.CharField(max_length=12, choices=State.choices, default=State.QUEUED)
    reason = models.CharField(max_length=500, blank=True)
    checkpoint_path = models.CharField(max_length=500, blank=True, help_text="Resume from here.")
    epochs_done = models.PositiveIntegerField(default=0)
    epochs_total = models.PositiveIntegerField(null=True, blank=True)
    times_preempted = models.PositiveIntegerField(default=0)
    # Continuation: what the job does when its slot ends before it does, and what a waiting
    # job waits for (training.continuation applies it at every tick).
    then = models.CharField(max_length=12, choices=Then.choices, default=Then.BACKFILL)
    then_team = models.BooleanField(default=False, help_text="next_booking may take a teammate's booking.")
    # When its owner was told it waits too long: the tick then needs one query for the jobs
    # that are due, not one notice lookup per queued job (issue #19).
    waiting_noticed_at = models.DateTimeField(null=True, blank=True)
    # The queue as people read it (training/queue.py): refreshed by the scheduler, read by pages and the API.
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    estimated_start = models.DateTimeField(null=True, blank=True)
    # No start found within the estimate's budget: the time the roll-forward reached, a lower bound.
    estimate_not_before = models.DateTimeField(null=True, blank=True)
    wait_reason = models.CharField(max_length=300, blank=True)
    estimated_at = models.DateTimeField(null=True, blank=True)
    # The run time backfill plans with (training/runtime.py): predicted at submit, with its source.
    predicted_duration_s = models.PositiveIntegerField(null=True, blank=True)
    runtime_source = models.CharField(max_length=8, blank=True)
    waiting_for = models.CharField(max_length=8, choices=WaitingFor.choices, default=WaitingFor.SLOT, blank=True)
    submitted_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-submitted_at", "-id"]
        indexes = [models.Index(fields=["state", "submitted_at"]), models.Index(fields=["team", "state"])]

    def __str__(self) -> str:
        return f"job #{self.pk} {self.name}"

    @property
    def is_yolo(self) -> bool:
        return not self.argv


class Run(models.Model):
    """One execution of a job on concrete GPUs."""

    class Kind(models.TextChoices):
        RESERVED = "reserved", "In a reservation"
        BACKFILL = "backfill", "Backfill"

    class State(models.TextChoices):
        STARTING = "starting", "Starting"  # claimed; the executor call may not have happened yet
        RUNNING = "running", "Running"
        STOPPING = "stopping", "Stopping"  # asked to checkpoint and exit
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        CHECKPOINTED = "checkpointed", "Checkpointed"  # stopped, resumable
        KILLED = "killed", "Killed"
        TIMED_OUT = "timed_out", "Timed out"
        CANCELLED = "cancelled", "Cancelled"

    LIVE = (State.STARTING, State.RUNNING, State.STOPPING)

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="runs")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    reservation = models.ForeignKey(
        Reservation, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs"
    )
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="runs")
    gpu_ids = models.JSONField(help_text="Database ids of the GPUs it holds.")
    gpu_indices = models.JSONField(help_text="Device indices on its node.")
    state = models.CharField(max_length=12, choices=State.choices, default=State.STARTING)
    exit_code = models.IntegerField(null=True, blank=True)
    reason = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    must_end_by = models.DateTimeField()
    estimated_end = models.DateTimeField(null=True, blank=True)
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    # The queued job this run was stopped to make room for (priority preemption, queue drain):
    # a drain's job and the GPUs it emptied are read back into the next snapshots.
    stopped_for = models.ForeignKey(
        TrainingJob, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # When the executor took the stop, and how often it was sent: a stop goes out once (and
    # once more only if the first provably did not arrive).
    stop_sent_at = models.DateTimeField(null=True, blank=True)
    stops_sent = models.PositiveSmallIntegerField(default=0)
    kill_at = models.DateTimeField(null=True, blank=True)
    preemptible = models.BooleanField(default=False)
    resumed_from = models.CharField(max_length=500, blank=True)
    checkpoint_path = models.CharField(max_length=500, blank=True)
    output_dir = models.CharField(max_length=500, blank=True)
    progress = models.JSONField(default=dict, blank=True, help_text="Latest progress event.")
    report_token_hash = models.CharField(max_length=64, blank=True)
    # What the executor's start() returned (Handle.as_dict()), stored as it gave it: stop,
    # kill, cleanup and the log tail use it (a Kubernetes handle carries its namespace).
    handle = models.JSONField(default=dict, blank=True, help_text="The executor's handle, as start() returned it.")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["state"])]
        constraints = [
            # One live run per job: two reconcilers can never start the same job twice.
            models.UniqueConstraint(
                fields=["job"], condition=Q(state__in=["starting", "running", "stopping"]), name="run_one_live_per_job"
            )
        ]

    def __str__(self) -> str:
        return f"run #{self.pk} of job #{self.job_id}"

    def issue_report_token(self) -> str:
        """A fresh per-run token for the runner's progress reports; only its hash is kept."""
        token = secrets.token_urlsafe(32)
        self.report_token_hash = hash_token(token)
        return token


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class RunMetric(models.Model):
    """One progress event of a run (epoch end, mostly): the series the loss curves draw."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metrics")
    event = models.CharField(max_length=32)
    epoch = models.PositiveIntegerField(null=True, blank=True)
    values = models.JSONField(default=dict)
    at = models.DateTimeField()

    class Meta:
        ordering = ["run", "id"]
        indexes = [models.Index(fields=["run", "epoch"])]

    def __str__(self) -> str:
        return f"{self.event} epoch {self.epoch} of run #{self.run_id}"


class Artifact(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="artifacts")
    name = models.CharField(max_length=200)
    path = models.CharField(max_length=500)
    size_bytes = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["run", "name"]
        constraints = [models.UniqueConstraint(fields=["run", "name"], name="artifact_unique_run_name")]

    def __str__(self) -> str:
        return f"{self.name} of run #{self.run_id}"


# --- the model registry (issue #17; services in training/registry.py) -------------------------


class RegisteredModel(models.Model):
    """A named model of a team ("vision/pcb-defect"); its versions are promoted runs."""

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="registered_models")
    name = models.SlugField(max_length=100, help_text="Lower-case letters, digits and dashes, e.g. pcb-defect.")
    description = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["team__slug", "name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="registeredmodel_unique_team_name")]

    def __str__(self) -> str:
        return self.full_name

    @property
    def full_name(self) -> str:
        return f"{self.team.slug}/{self.name}"


class ModelVersion(models.Model):
    """One promoted run's best weights, frozen with the metrics, data and spec that made them."""

    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="model_versions")
    metrics = models.JSONField(default=dict, help_text="The run's final validation metrics.")
    data = models.CharField(max_length=500, help_text="The data YAML it was trained on.")
    spec = models.JSONField(default=dict, help_text="The job spec as submitted.")
    weights_sha256 = models.CharField(max_length=64)
    note = models.CharField(max_length=500, blank=True)
    promoted_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    promoted_at = models.DateTimeField()

    class Meta:
        ordering = ["model", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["model", "version"], name="modelversion_unique_model_version"),
        ]

    def __str__(self) -> str:
        return f"{self.model.full_name} v{self.version}"


# --- run logs and the archive (issue #17; services in training/logs.py) -----------------------


class RunLog(models.Model):
    """A run's full log, kept at its end: gzip on the archive storage, lines in RunLogLine."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="full_log")
    storage_name = models.CharField(max_length=300, help_text="The .log.gz on the archive storage.")
    size_bytes = models.BigIntegerField(help_text="Uncompressed.")
    compressed_bytes = models.BigIntegerField()
    sha256 = models.CharField(max_length=64, help_text="Of the uncompressed text.")
    line_count = models.PositiveIntegerField()
    collected_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"log of run #{self.run_id}"


class RunLogLine(models.Model):
    """One line of a run's log, for keyword search across a team's runs."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="log_lines")
    number = models.PositiveIntegerField(help_text="1-based line number.")
    text = models.TextField()

    class Meta:
        ordering = ["run", "number"]
        constraints = [models.UniqueConstraint(fields=["run", "number"], name="runlogline_unique_run_number")]

    def __str__(self) -> str:
        return f"run #{self.run_id} line {self.number}"


class LogArchive(models.Model):
    """One compressed archive of rows moved out of the database by the retention sweep."""

    class Kind(models.TextChoices):
        RUN_LOG = "run_log", "A run's log lines"
        TELEMETRY = "telemetry", "GPU telemetry samples"
        NOTICES = "notices", "Notices and their deliveries"

    kind = models.CharField(max_length=12, choices=Kind.choices)
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="archives")
    storage_name = models.CharField(max_length=300, unique=True)
    row_count = models.PositiveIntegerField()
    older_than = models.DateTimeField(help_text="Everything archived was older than this.")
    archived_at = models.DateTimeField()
    restored_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-archived_at", "-id"]

    def __str__(self) -> str:
        return self.storage_name
