"""Runtime estimate for a job that gives none.

Rule (Tsafrir, Etsion & Feitelson, "Backfilling using system-generated predictions rather
than user runtime estimates", IEEE TPDS 2007): predict a job's runtime as the mean of the
same user's last two runs of similar size; with one such run use it; with none use the
policy default. "Similar size" is the same power-of-two GPU bucket (1, 2, 3-4, 5-8, ...),
since a user's 1-GPU experiments and 8-GPU trainings have unrelated lengths.

Correction (also from Tsafrir et al.): when a run outlives its job's estimate and is
stopped, the estimate grows to twice what the job has been seen to need, so a badly
under-estimated job cannot be started into too-short gaps over and over.

`predict_runtime` is the production entry (issue #18 item 4): the owner's history of
*similar* jobs first (the same `similar` signature, e.g. image, model, dataset, epochs and
image size; else the same size class as above), then the user's own estimate, then the
policy default; it says which of the three it used (`RuntimeSource`), for the job page.

Pure: the caller passes the history (the lead: finished runs from the DB; the simulator:
its own record), nothing is read here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from scheduler.instants import to_seconds
from scheduler.snapshot import Id, Instant


@dataclass(frozen=True, slots=True)
class PastRun:
    user: Id
    gpus: int
    duration_s: float
    ended_at: Instant
    job_id: Id = 0
    # What makes two jobs alike beyond the owner and size (gpubook: image, model, dataset,
    # epochs, imgsz); () when unknown.
    similar: tuple = ()


class RuntimeSource(StrEnum):
    HISTORY = "history"
    USER = "user"
    DEFAULT = "default"


@dataclass(frozen=True, slots=True)
class RuntimeEstimate:
    seconds: float
    source: RuntimeSource


def size_class(gpus: int) -> int:
    """The power-of-two bucket a GPU count falls in: 1→0, 2→1, 3-4→2, 5-8→3, ..."""
    if gpus < 1:
        raise ValueError(f"gpus must be at least 1, got {gpus}")
    return (gpus - 1).bit_length()


def estimate_from_recent(recent_durations_s: Sequence[float], default_s: float) -> float:
    """Mean of the (at most two) most recent durations, or the default when there are none."""
    last_two = list(recent_durations_s)[-2:]
    if not last_two:
        return default_s
    return sum(last_two) / len(last_two)


def estimate_duration_s(
    history: Iterable[PastRun], *, user: Id, gpus: int, default_s: float
) -> float:
    """Tsafrir estimate from a full history; newest runs are those that ended last
    (ties broken by job id so the answer never depends on the history's order)."""
    bucket = size_class(gpus)
    similar = sorted(
        (
            (to_seconds(past.ended_at), past.job_id, past.duration_s)
            for past in history
            if past.user == user and size_class(past.gpus) == bucket
        ),
    )
    return estimate_from_recent([duration for _, _, duration in similar], default_s)


def grown_estimate(estimate_s: float | None, ran_s: float, default_s: float) -> float:
    """The estimate after a run of `ran_s` seconds ended without finishing the job."""
    current = estimate_s if estimate_s is not None else default_s
    if ran_s < current:
        return current
    return 2.0 * ran_s


def predict_runtime(
    history: Iterable[PastRun],
    *,
    user: Id,
    gpus: int,
    default_s: float,
    similar: tuple = (),
    user_estimate_s: float | None = None,
) -> RuntimeEstimate:
    """The owner's last two runs of the same `similar` signature (when given and seen),
    else of the same size class; else the user's estimate; else the default."""
    bucket = size_class(gpus)
    same_signature: list[tuple[float, Id, float]] = []
    same_size: list[tuple[float, Id, float]] = []
    for past in history:
        if past.user != user:
            continue
        entry = (to_seconds(past.ended_at), past.job_id, past.duration_s)
        if similar and past.similar == similar:
            same_signature.append(entry)
        if size_class(past.gpus) == bucket:
            same_size.append(entry)
    for found in (same_signature, same_size):
        if found:
            found.sort()
            return RuntimeEstimate(
                estimate_from_recent([duration for _, _, duration in found], default_s),
                RuntimeSource.HISTORY,
            )
    if user_estimate_s is not None and user_estimate_s > 0:
        return RuntimeEstimate(float(user_estimate_s), RuntimeSource.USER)
    return RuntimeEstimate(default_s, RuntimeSource.DEFAULT)
