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
    those. At one start, suggestions pack (DESIGN: bookings kept packed, issue #15): the node
    with the fewest free GPUs to spare comes first, and on it the GPUs whose free time ends
    soonest after the slot, so whole nodes and long free stretches stay open for wide jobs
    and long bookings, as the simulator's booking service places them (best fit). Ties break
    by node name, then the lowest GPU ids, so the answer is deterministic."""
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
            # (end of the free window holding the slot, GPU) for each GPU free all through it.
            fitting = sorted(
                (b, gpu_id) for gpu_id in gpu_ids for a, b in free_by_gpu[gpu_id] if a <= start and end <= b
            )
            if len(fitting) >= gpus:
                chosen = tuple(sorted(gpu_id for _, gpu_id in fitting[:gpus]))
                found.append((start, len(fitting) - gpus, Slot(node=node, start=start, end=end, gpu_ids=chosen)))
    found.sort(key=lambda row: (row[0], row[1], row[2].node, row[2].gpu_ids))
    return [slot for _, _, slot in found[:limit]]
