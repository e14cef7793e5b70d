"""The simulated booking service's calendar: booked intervals per GPU, never overlapping."""

from __future__ import annotations

import bisect

from scheduler.snapshot import Gpu, Id


class Calendar:
    """Booked intervals per GPU, for the simulated booking service (no overlap, ever)."""

    def __init__(self, gpus: tuple[Gpu, ...]) -> None:
        self.nodes: dict[Id, list[Id]] = {}
        for gpu in gpus:
            self.nodes.setdefault(gpu.node, []).append(gpu.id)
        self.starts: dict[Id, list[float]] = {gpu.id: [] for gpu in gpus}
        self.ends: dict[Id, list[float]] = {gpu.id: [] for gpu in gpus}

    def is_free(self, gpu_id: Id, start_s: float, end_s: float) -> bool:
        starts = self.starts[gpu_id]
        position = bisect.bisect_left(starts, end_s)
        # The interval starting before our end with the latest start must end by our start.
        return position == 0 or self.ends[gpu_id][position - 1] <= start_s

    def book(self, gpus_needed: int, start_s: float, end_s: float) -> tuple[Id, ...] | None:
        for gpu_ids in self.nodes.values():
            free = [gpu_id for gpu_id in gpu_ids if self.is_free(gpu_id, start_s, end_s)]
            if len(free) >= gpus_needed:
                chosen = tuple(free[:gpus_needed])
                for gpu_id in chosen:
                    position = bisect.bisect_left(self.starts[gpu_id], start_s)
                    self.starts[gpu_id].insert(position, start_s)
                    self.ends[gpu_id].insert(position, end_s)
                return chosen
        return None

    def free_on_node(self, gpu_ids: list[Id], start_s: float, end_s: float) -> list[Id]:
        return [gpu_id for gpu_id in gpu_ids if self.is_free(gpu_id, start_s, end_s)]

    def add(self, gpu_ids: tuple[Id, ...], start_s: float, end_s: float) -> None:
        for gpu_id in gpu_ids:
            position = bisect.bisect_left(self.starts[gpu_id], start_s)
            self.starts[gpu_id].insert(position, start_s)
            self.ends[gpu_id].insert(position, end_s)
