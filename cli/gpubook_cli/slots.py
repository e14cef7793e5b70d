"""Finding the next slots where k GPUs of one node are free together for a duration. Pure:
the CLI feeds it each GPU's free windows from the API's availability endpoint."""

import datetime as dt
from dataclasses import dataclass


@dataclass(frozen=True)
class Slot:
    node: str
    start: dt.datetime
    end: dt.datetime
    gpu_ids: tuple[int, ...]


def next_slots(
    *,
    free_by_gpu: dict[int, list[tuple[dt.datetime, dt.datetime]]],
    node_of: dict[int, str],
    gpus: int,
    duration: dt.timedelta,
    earliest: dt.datetime,
    limit: int = 5,
) -> list[Slot]:
    """The earliest `limit` start times (one per node and start) at which `gpus` GPUs of one
    node are all free for `duration`. A candidate start is `earliest` or the start of some
    GPU's free window: the first moment a set of GPUs can be free together is always one of
    those. Ties break by node name, then the lowest GPU ids, so the answer is deterministic."""
    by_node: dict[str, list[int]] = {}
    for gpu_id in sorted(free_by_gpu):
        by_node.setdefault(node_of[gpu_id], []).append(gpu_id)
    found: list[Slot] = []
    for node, gpu_ids in sorted(by_node.items()):
        if len(gpu_ids) < gpus:
            continue
        candidates = {earliest} | {
            start for gpu_id in gpu_ids for start, _ in free_by_gpu[gpu_id] if start >= earliest
        }
        for start in sorted(candidates):
            end = start + duration
            fitting = [
                gpu_id for gpu_id in gpu_ids
                if any(a <= start and end <= b for a, b in free_by_gpu[gpu_id])
            ]
            if len(fitting) >= gpus:
                found.append(Slot(node=node, start=start, end=end, gpu_ids=tuple(fitting[:gpus])))
    found.sort(key=lambda slot: (slot.start, slot.node, slot.gpu_ids))
    return found[:limit]
