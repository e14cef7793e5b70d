from django.db import transaction

from gpus.discovery import DiscoveredNode
from gpus.models import Gpu, Node


def inventory_register(*, node: DiscoveredNode) -> tuple[Node, int, int]:
    """Create or update a node and its GPUs by (node, index). Never deletes a GPU: bookings
    refer to it; an admin drains or retires it instead. Returns (node, created, updated)."""
    created = updated = 0
    with transaction.atomic():
        node_row, _ = Node.objects.get_or_create(name=node.name)
        for gpu in node.gpus:
            _, was_created = Gpu.objects.update_or_create(
                node=node_row,
                index=gpu.index,
                defaults={"model_name": gpu.model_name, "memory_mib": gpu.memory_mib, "uuid": gpu.uuid},
            )
            created += was_created
            updated += not was_created
    return node_row, created, updated
