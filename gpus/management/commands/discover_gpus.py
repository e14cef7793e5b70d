import socket
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from gpus.discovery import (
    DiscoveredNode,
    InventoryError,
    NvmlUnavailable,
    discover_local_gpus,
    load_inventory,
)
from gpus.services import inventory_register


class Command(BaseCommand):
    help = "Register this host's GPUs (NVML), or the nodes of a YAML inventory file."

    def add_arguments(self, parser):
        parser.add_argument("--inventory", type=Path, help="YAML inventory to use instead of NVML")
        parser.add_argument("--node-name", default=socket.gethostname(), help="name of this host")

    def handle(self, *args, inventory: Path | None, node_name: str, **options):
        if inventory is not None:
            try:
                nodes = load_inventory(inventory)
            except InventoryError as error:
                raise CommandError(str(error)) from error
        else:
            try:
                nodes = [DiscoveredNode(name=node_name, gpus=tuple(discover_local_gpus()))]
            except NvmlUnavailable as error:
                raise CommandError(
                    f"{error} No GPUs were registered. On a host without NVIDIA drivers, "
                    "declare the GPUs in a YAML file and pass --inventory FILE."
                ) from error
        for node in nodes:
            row, created, updated = inventory_register(node=node)
            self.stdout.write(f"{row.name}: {created} GPU(s) added, {updated} updated")
