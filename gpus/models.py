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
