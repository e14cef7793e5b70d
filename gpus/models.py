from django.db import models
from django.db.models import Q


class Node(models.Model):
    """A GPU server. `name` is its Kubernetes node name (kubernetes.io/hostname) or host name."""

    name = models.CharField(max_length=253, unique=True)
    description = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Gpu(models.Model):
    class State(models.TextChoices):
        ACTIVE = "active", "Active"
        DRAINED = "drained", "Drained (no new bookings)"
        MAINTENANCE = "maintenance", "In maintenance"

    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="gpus")
    index = models.PositiveSmallIntegerField(help_text="Device index on its node (CUDA order).")
    uuid = models.CharField(max_length=64, blank=True, help_text="NVML UUID where known.")
    model_name = models.CharField(max_length=100)
    memory_mib = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.ACTIVE)

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_node_index"),
            models.UniqueConstraint(
                fields=["uuid"], condition=~Q(uuid=""), name="gpu_unique_uuid_when_known"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.node.name}/gpu{self.index}"

    @property
    def label(self) -> str:
        return f"{self.node.name} GPU {self.index} ({self.model_name}, {self.memory_mib // 1024} GiB)"


class MaintenanceWindow(models.Model):
    """GPUs of a node (all of them, or the listed ones) cannot be booked during [start, end)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="maintenance_windows")
    gpus = models.ManyToManyField(
        Gpu, blank=True, help_text="Leave empty to cover every GPU of the node."
    )
    start = models.DateTimeField()
    end = models.DateTimeField()
    reason = models.CharField(max_length=200)

    class Meta:
        ordering = ["start"]
        constraints = [
            models.CheckConstraint(condition=Q(end__gt=models.F("start")), name="maintenance_end_after_start")
        ]

    def __str__(self) -> str:
        return f"{self.node.name} maintenance {self.start:%Y-%m-%d %H:%M}–{self.end:%H:%M}: {self.reason}"


class GpuSample(models.Model):
    """One GPU's telemetry over one minute: the mean and max of the raw samples taken in it.

    Raw samples never reach the database: agents (and the embedded sampler) fold them into
    minute buckets first, and rows older than GPUBOOK_TELEMETRY_RETENTION_DAYS are pruned.
    A figure NVML could not read in that minute stays NULL: telemetry never invents numbers.
    Units are Prometheus base units: utilization as a ratio 0–1, bytes, celsius, watts.
    """

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="samples")
    minute = models.DateTimeField(help_text="Start of the minute (UTC) the figures cover.")
    sample_count = models.PositiveIntegerField(default=0)
    utilization_mean = models.FloatField(null=True, blank=True)
    utilization_max = models.FloatField(null=True, blank=True)
    memory_used_bytes_mean = models.BigIntegerField(null=True, blank=True)
    memory_used_bytes_max = models.BigIntegerField(null=True, blank=True)
    memory_total_bytes = models.BigIntegerField(null=True, blank=True)
    temperature_celsius_mean = models.FloatField(null=True, blank=True)
    temperature_celsius_max = models.FloatField(null=True, blank=True)
    power_watts_mean = models.FloatField(null=True, blank=True)
    power_watts_max = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["gpu", "minute"]
        indexes = [models.Index(fields=["minute"])]
        constraints = [models.UniqueConstraint(fields=["gpu", "minute"], name="gpusample_unique_gpu_minute")]

    def __str__(self) -> str:
        return f"GPU {self.gpu_id} at {self.minute:%Y-%m-%d %H:%M}"


# The idle report's thresholds that the hourly roll-up answers exactly: every whole percent
# on a 5 % grid. A threshold off the grid is answered from the minute buckets instead.
IDLE_GRID_PERCENTS = tuple(range(5, 101, 5))


class GpuHourSummary(models.Model):
    """One GPU's telemetry over one UTC hour, rolled up from its minute buckets so the reports
    read 24 rows a GPU-day instead of 1,440. Refreshed from the buckets whenever a batch for
    that hour is stored (gpus.telemetry.store.samples_record), so it is never behind them.
    Kept when the buckets are pruned or archived: it is the reports' history.

    `samples` counts the minutes with a utilization figure and `sum_utilization` adds them
    (the hour's mean is the ratio); `under_K` counts those minutes whose mean utilization was
    below K % (K on IDLE_GRID_PERCENTS), so "idle under K %" needs no minute buckets.
    """

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="hour_summaries")
    hour = models.DateTimeField(help_text="Start of the UTC hour the figures cover.")
    samples = models.PositiveIntegerField(default=0)
    sum_utilization = models.FloatField(default=0.0)
    under_5 = models.PositiveIntegerField(default=0)
    under_10 = models.PositiveIntegerField(default=0)
    under_15 = models.PositiveIntegerField(default=0)
    under_20 = models.PositiveIntegerField(default=0)
    under_25 = models.PositiveIntegerField(default=0)
    under_30 = models.PositiveIntegerField(default=0)
    under_35 = models.PositiveIntegerField(default=0)
    under_40 = models.PositiveIntegerField(default=0)
    under_45 = models.PositiveIntegerField(default=0)
    under_50 = models.PositiveIntegerField(default=0)
    under_55 = models.PositiveIntegerField(default=0)
    under_60 = models.PositiveIntegerField(default=0)
    under_65 = models.PositiveIntegerField(default=0)
    under_70 = models.PositiveIntegerField(default=0)
    under_75 = models.PositiveIntegerField(default=0)
    under_80 = models.PositiveIntegerField(default=0)
    under_85 = models.PositiveIntegerField(default=0)
    under_90 = models.PositiveIntegerField(default=0)
    under_95 = models.PositiveIntegerField(default=0)
    under_100 = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["gpu", "hour"]
        indexes = [models.Index(fields=["hour"])]
        constraints = [models.UniqueConstraint(fields=["gpu", "hour"], name="gpuhoursummary_unique_gpu_hour")]

    def __str__(self) -> str:
        return f"GPU {self.gpu_id} hour {self.hour:%Y-%m-%d %H}"


class NodeAgentToken(models.Model):
    """The credential a node's `gpu_agent` posts telemetry with. Only the SHA-256 is kept."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="agent_tokens")
    token_hash = models.CharField(max_length=64, unique=True)
    description = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked = models.BooleanField(default=False)

    class Meta:
        ordering = ["node", "created_at"]

    def __str__(self) -> str:
        return f"agent token of {self.node.name}" + (" (revoked)" if self.revoked else "")


class MonitoringValue(models.Model):
    """A named figure shared by every process (web workers, Celery, the embedded loop) so that
    /metrics, served by any one of them, reports all: booking conflicts, scheduler ticks.
    Counters only ever grow (`value` += n); gauges are overwritten."""

    name = models.CharField(max_length=100)
    labels = models.CharField(max_length=200, blank=True, help_text='Sorted "key=value" pairs, comma-joined.')
    value = models.FloatField(default=0.0)
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["name", "labels"]
        constraints = [models.UniqueConstraint(fields=["name", "labels"], name="monitoringvalue_unique_name_labels")]

    def __str__(self) -> str:
        return f"{self.name}{{{self.labels}}} = {self.value}"
