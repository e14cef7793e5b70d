"""Policy: the order in which queued jobs get idle GPUs.

Rule (`QueueOrder.FAIR_SHARE`), the sort key of a job is, in this order:
1. **Priority class**: urgent, high, medium, low. Urgent counts only for the first
   `urgent_limit_per_team` urgent jobs of a team (its urgent runs holding GPUs included,
   then its queued urgent jobs by submit time); the rest rank as high. Every
   `class_promotion_after_s` of waiting moves a job one class up, up to high. Jobs of a team
   past its quota that an admin lets run anyway come after all classes.
2. **Fair-share score** (see fair_share): less recent usage against the share ranks higher.
   Entry penalty: the estimated GPU-seconds of the same user's earlier queued jobs count as
   if already used (times `entry_penalty`), so a burst of submissions interleaves with
   other users instead of jumping them. Aging: each hour waited lowers the score by
   `aging_per_hour`, so nothing starves.
3. **Submit time**, then **id** (deterministic tie-break).

`QueueOrder.FIFO`: submit time, then id, nothing else (the baseline).

How it stays cheap at thousands of jobs: a job's key depends only on its own user's
earlier jobs, so within one (team, user, class) stream the keys never decrease (later jobs
carry more entry penalty and less aging). The order is therefore a k-way merge of the
streams: only the head of each stream is keyed, and only as many jobs as backfill consumes
are produced. The result is exactly the full sort, for a fraction of the work.
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate, groupby

from scheduler.fair_share import FairShare
from scheduler.instants import to_seconds
from scheduler.policy import HOUR_S, Policy, QueueOrder
from scheduler.quota import QuotaBook, QuotaStanding
from scheduler.snapshot import Id, Priority, QueuedJob, Run

_SUBMIT_ORDER = operator.attrgetter("submitted_at", "id")
_USER_OF = operator.attrgetter("team", "user")
_PRIORITY = operator.attrgetter("priority")
CLASS_RANK = {Priority.URGENT: 0, Priority.HIGH: 1, Priority.MEDIUM: 2, Priority.LOW: 3}
HIGH_RANK = CLASS_RANK[Priority.HIGH]
OVER_QUOTA_RANK = 4


def _submitted_s(job: QueuedJob) -> float:
    submitted = job.submitted_at
    return submitted if submitted.__class__ is float else to_seconds(submitted)


# What `classify` says about a job: start it if it fits, or only protect it (EASY) if it is
# the best-ranked job that cannot fit the idle GPUs now.
CANDIDATE = 0
PROTECT_ONLY = 1

OrderKey = tuple


def order_queue(
    *,
    queued_jobs: tuple[QueuedJob, ...],
    runs: list[Run],
    fair_share: Callable[[Iterable[tuple[Id, Id]]], FairShare],
    quota: QuotaBook,
    classify: Callable[[QueuedJob], int | None],
    now_s: float,
    policy: Policy,
) -> tuple[Ordered, Ordered]:
    """Two lazy orders, best first, of (key, job): the jobs `classify` calls CANDIDATE and
    those it calls PROTECT_ONLY (None: left out). Keys of both compare with each other, as
    they come from one rule. `fair_share` is called only when needed (FIFO never pays)."""
    # Sorting on the attributes themselves runs in C (datetimes and floats both order
    # correctly); a plan touches every queued job here, so this is the hot loop.
    by_submit = sorted(queued_jobs, key=_SUBMIT_ORDER)
    if policy.queue_order == QueueOrder.FIFO:
        return (
            _Fifo(by_submit, classify, CANDIDATE),
            _Fifo(by_submit, classify, PROTECT_ONLY),
        )

    demoted_urgent = _urgent_over_limit(queued_jobs, runs, policy)
    # One stream per (team, user, class), in submit order, each with the entry penalty of
    # the user's queued jobs before each job. Grouping sorts in C (stable: submit order
    # stays within a user) and the penalties are running sums, so the per-job Python work
    # is one product; `classify` runs lazily, only on the jobs the merges reach.
    entry_penalty = policy.entry_penalty
    default_estimate_s = policy.default_estimate_s
    streams: list[_Stream] = []
    users: list[tuple[Id, Id]] = []
    for user_key, group in groupby(sorted(by_submit, key=_USER_OF), key=_USER_OF):
        jobs = list(group)
        users.append(user_key)
        # ahead[i]: the penalty of the user's jobs before job i, summed in submit order.
        ahead = list(accumulate(
            [
                job.gpus_needed * (job.estimated_duration_s or default_estimate_s)
                * entry_penalty
                for job in jobs
            ],
            initial=0.0,
        ))
        priorities = set(map(_PRIORITY, jobs))
        if len(priorities) == 1 and Priority.URGENT not in priorities:
            streams.append(_Stream(CLASS_RANK[priorities.pop()], jobs, ahead, classify))
            continue
        by_rank: dict[int, tuple[list[QueuedJob], list[float]]] = {}
        for job, job_ahead in zip(jobs, ahead, strict=False):
            rank = CLASS_RANK[job.priority]
            if rank == 0 and job.id in demoted_urgent:
                rank = HIGH_RANK
            rank_jobs, rank_ahead = by_rank.setdefault(rank, ([], []))
            rank_jobs.append(job)
            rank_ahead.append(job_ahead)
        for rank, (rank_jobs, rank_ahead) in by_rank.items():
            streams.append(_Stream(rank, rank_jobs, rank_ahead, classify))
    promotion_s = policy.class_promotion_after_s
    aging_per_s = policy.aging_per_hour / HOUR_S
    shares: FairShare | None = None

    def key_of(base_rank: int, ahead: float, job: QueuedJob) -> OrderKey:
        nonlocal shares
        if shares is None:
            # Only once some job is ordered (a plan whose jobs all stay out never pays).
            shares = fair_share(users)
        submitted = job.submitted_at
        submitted_s = submitted if submitted.__class__ is float else to_seconds(submitted)
        waited_s = max(now_s - submitted_s, 0.0)
        rank = base_rank
        if rank > HIGH_RANK and promotion_s > 0:
            rank = max(HIGH_RANK, rank - int(waited_s // promotion_s))
        if quota.standing(job.team) == QuotaStanding.OVER_ALLOWED:
            rank = OVER_QUOTA_RANK
        score = shares.score(job.team, job.user, ahead) - aging_per_s * waited_s
        return (rank, score, submitted_s, job.id)

    return _Merging(streams, CANDIDATE, key_of), _Merging(streams, PROTECT_ONLY, key_of)


_UNKNOWN = -1


class _Stream:
    """One (team, user, class) stream: its jobs in submit order, the entry penalty before
    each, and `classify`'s verdicts, asked once each, on first need."""

    __slots__ = ("ahead", "base_rank", "classify", "jobs", "kinds")

    def __init__(
        self, base_rank: int, jobs: list[QueuedJob], ahead: list[float],
        classify: Callable[[QueuedJob], int | None],
    ) -> None:
        self.base_rank = base_rank
        self.jobs = jobs
        self.ahead = ahead
        self.classify = classify
        self.kinds: list[int | None] = [_UNKNOWN] * len(jobs)

    def find(self, kind: int, position: int) -> int:
        """The first position from `position` on whose job is of `kind` (len: none)."""
        kinds = self.kinds
        jobs = self.jobs
        classify = self.classify
        while position < len(jobs):
            verdict = kinds[position]
            if verdict == _UNKNOWN:
                verdict = kinds[position] = classify(jobs[position])
            if verdict == kind:
                return position
            position += 1
        return position


class Ordered:
    """A lazy order of (key, job), best first. `remaining()` lists the jobs it has not
    produced yet, in no particular order: backfill asks it whether any of them could still
    start before it pays for ordering them."""

    __slots__ = ()

    def __iter__(self) -> Ordered:
        return self

    def __next__(self) -> tuple[OrderKey, QueuedJob]:
        raise NotImplementedError

    def remaining(self) -> Iterator[QueuedJob]:
        raise NotImplementedError


class _Fifo(Ordered):
    """Strict FIFO usually looks at the head only, so classify only what is asked."""

    __slots__ = ("_by_submit", "_classify", "_kind", "_position")

    def __init__(
        self, by_submit: list[QueuedJob], classify: Callable[[QueuedJob], int | None], kind: int
    ) -> None:
        self._by_submit = by_submit
        self._classify = classify
        self._kind = kind
        self._position = 0

    def __next__(self) -> tuple[OrderKey, QueuedJob]:
        by_submit = self._by_submit
        while self._position < len(by_submit):
            job = by_submit[self._position]
            self._position += 1
            if self._classify(job) == self._kind:
                return (_submitted_s(job), job.id), job
        raise StopIteration

    def remaining(self) -> Iterator[QueuedJob]:
        classify, kind = self._classify, self._kind
        return (job for job in self._by_submit[self._position:] if classify(job) == kind)


class _Merging(Ordered):
    """k-way merge of the streams' jobs of one kind; keys never decrease along a stream,
    so only each stream's next job of that kind is keyed (the order is the full sort's)."""

    __slots__ = ("_heap", "_key_of", "_kind", "_positions", "_streams")

    def __init__(
        self,
        streams: list[_Stream],
        kind: int,
        key_of: Callable[[int, float, QueuedJob], OrderKey],
    ) -> None:
        self._streams = streams
        self._kind = kind
        self._key_of = key_of
        self._positions: list[int] = []
        self._heap: list[tuple[OrderKey, int]] | None = None  # keyed on first use

    def _push(self, heap: list, number: int, position: int) -> None:
        stream = self._streams[number]
        position = stream.find(self._kind, position)
        self._positions[number] = position
        if position < len(stream.jobs):
            heapq.heappush(
                heap,
                (self._key_of(stream.base_rank, stream.ahead[position], stream.jobs[position]),
                 number),
            )

    def __next__(self) -> tuple[OrderKey, QueuedJob]:
        heap = self._heap
        if heap is None:
            heap = self._heap = []
            self._positions = [0] * len(self._streams)
            for number in range(len(self._streams)):
                self._push(heap, number, 0)
        elif heap:
            # Advance the stream of the job produced last only now: its successor's key may
            # depend on what the caller did with that job (a quota charge).
            number = heapq.heappop(heap)[1]
            self._push(heap, number, self._positions[number] + 1)
        if not heap:
            raise StopIteration
        key, number = heap[0]
        return key, self._streams[number].jobs[self._positions[number]]

    def remaining(self) -> Iterator[QueuedJob]:
        heap = self._heap
        produced = heap[0][1] if heap else None  # its position is not advanced yet
        kind = self._kind
        for number, stream in enumerate(self._streams):
            position = self._positions[number] if heap is not None else 0
            position = stream.find(kind, position + (number == produced))
            while position < len(stream.jobs):
                yield stream.jobs[position]
                position = stream.find(kind, position + 1)


def _urgent_over_limit(
    queued_jobs: tuple[QueuedJob, ...], runs: list[Run], policy: Policy
) -> set[Id]:
    """Ids of queued urgent jobs beyond their team's urgent limit (they rank as high)."""
    urgent = [
        (_submitted_s(job), job.id, job) for job in queued_jobs if job.priority == Priority.URGENT
    ]
    if not urgent:
        return set()
    urgent.sort(key=lambda entry: (entry[0], entry[1]))
    in_use: dict[Id, int] = {}
    for run in runs:
        if run.priority == Priority.URGENT:
            in_use[run.team] = in_use.get(run.team, 0) + 1
    over: set[Id] = set()
    for _, job_id, job in urgent:
        used = in_use.get(job.team, 0)
        if used < policy.urgent_limit_per_team:
            in_use[job.team] = used + 1
        else:
            over.add(job_id)
    return over
