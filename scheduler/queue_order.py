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
   `aging_per_hour`, so nothing starves. Size lanes (shortest predicted first): the score
   of a job that could start now grows by `size_lane_weight` per doubling of its predicted
   GPU-seconds above `size_lane_base_gpu_s`; a job that cannot start now (the one backfill
   may hold GPUs for, EASY) is ranked without lanes, so wide jobs still get held for.
3. **Submit time**, then **id** (deterministic tie-break).

`QueueOrder.FIFO`: submit time, then id, nothing else (the baseline).

How it stays cheap at thousands of jobs: a job's key depends only on its own user's
earlier jobs and its own lane, so within one (team, user, class, lane) stream the keys never
decrease (later jobs carry more entry penalty and less aging). The order is therefore a
k-way merge of the streams: only the head of each stream is keyed, and only as many jobs as
backfill consumes are produced. The result is exactly the full sort, for a fraction of the work.
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Callable, Iterable, Iterator
from math import frexp

from scheduler.fair_share import FairShare
from scheduler.instants import to_seconds
from scheduler.policy import HOUR_S, Policy, QueueOrder
from scheduler.quota import QuotaBook, QuotaStanding
from scheduler.snapshot import Id, Priority, QueuedJob, Run

_SUBMIT_ORDER = operator.attrgetter("submitted_at", "id")
PRIORITY_OF = operator.attrgetter("priority")
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
    # Streams of (entry penalty so far, submitted_s, id, job), one per (team, user, class),
    # separately for candidates and protect-only jobs.
    streams: tuple[dict, dict] = ({}, {})
    ahead_by_user: dict[tuple[Id, Id], float] = {}
    ahead_of = ahead_by_user.get
    entry_penalty = policy.entry_penalty
    default_estimate_s = policy.default_estimate_s
    class_rank = CLASS_RANK
    lane_weight = policy.size_lane_weight
    lane_base_s = policy.size_lane_base_gpu_s
    for job, kind in zip(by_submit, map(classify, by_submit), strict=True):
        team = job.team
        user = job.user
        user_key = (team, user)
        ahead = ahead_of(user_key, 0.0)
        job_gpu_s = job.gpus_needed * (job.estimated_duration_s or default_estimate_s)
        ahead_by_user[user_key] = ahead + job_gpu_s * entry_penalty
        if kind is None:
            continue
        rank = class_rank[job.priority]
        if rank == 0 and job.id in demoted_urgent:
            rank = HIGH_RANK
        lane = 0
        # Lanes order the jobs that can start now; the job to hold GPUs for (EASY) is
        # chosen without them, or wide jobs, last in every lane, would never be held for.
        if lane_weight and kind == CANDIDATE and job_gpu_s > lane_base_s:
            # The doubling class above the base: ceil(log2(ratio)), from frexp in C.
            mantissa, exponent = frexp(job_gpu_s / lane_base_s)
            lane = exponent - 1 if mantissa == 0.5 else exponent
        submitted = job.submitted_at
        entry = (
            ahead,
            submitted if submitted.__class__ is float else to_seconds(submitted),
            job.id,
            job,
        )
        stream = streams[kind].get((team, user, rank, lane))
        if stream is None:
            streams[kind][(team, user, rank, lane)] = [entry]
        else:
            stream.append(entry)
    if not streams[CANDIDATE] and not streams[PROTECT_ONLY]:
        return _Fifo([], classify, CANDIDATE), _Fifo([], classify, PROTECT_ONLY)

    shares = fair_share(ahead_by_user.keys())
    promotion_s = policy.class_promotion_after_s
    aging_per_s = policy.aging_per_hour / HOUR_S

    def key_of(
        base_rank: int, lane: int, entry: tuple[float, float, Id, QueuedJob],
        standing: Callable[[Id], QuotaStanding] = quota.standing,
    ) -> OrderKey:
        ahead, submitted_s, job_id, job = entry
        waited_s = max(now_s - submitted_s, 0.0)
        rank = base_rank
        if rank > HIGH_RANK and promotion_s > 0:
            rank = max(HIGH_RANK, rank - int(waited_s // promotion_s))
        if standing(job.team) == QuotaStanding.OVER_ALLOWED:
            rank = OVER_QUOTA_RANK
        score = (
            shares.score(job.team, job.user, ahead) + lane_weight * lane - aging_per_s * waited_s
        )
        return (rank, score, submitted_s, job_id)

    teams = {team for team, _ in ahead_by_user}
    return (
        _Merging(streams[CANDIDATE], key_of, quota, teams),
        _Merging(streams[PROTECT_ONLY], key_of, quota, teams),
    )


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
    """k-way merge of streams whose keys never decrease: only heads are keyed."""

    __slots__ = ("_heap", "_key_of", "_positions", "_quota", "_streams", "_teams")

    def __init__(
        self,
        streams: dict[tuple[Id, Id, int, int], list[tuple[float, float, Id, QueuedJob]]],
        key_of: Callable[..., OrderKey],
        quota: QuotaBook,
        teams: set[Id],
    ) -> None:
        self._streams = list(streams.items())
        self._quota = quota
        self._teams = teams
        self._positions = [0] * len(self._streams)
        self._key_of = key_of
        self._heap: list[tuple[OrderKey, int]] | None = None  # keyed on first use

    def __next__(self) -> tuple[OrderKey, QueuedJob]:
        heap = self._heap
        if heap is None:
            key_of = self._key_of
            # Nothing is charged while the heads are keyed: each team's standing once.
            standing = {team: self._quota.standing(team) for team in self._teams}.__getitem__
            heap = self._heap = [
                (key_of(base_rank, lane, entries[0], standing), number)
                for number, ((_, _, base_rank, lane), entries) in enumerate(self._streams)
            ]
            heapq.heapify(heap)
        elif heap:
            # Advance the stream of the job produced last only now: its successor's key may
            # depend on what the caller did with that job (a quota charge).
            number = heap[0][1]
            (_, _, base_rank, lane), entries = self._streams[number]
            position = self._positions[number] + 1
            self._positions[number] = position
            if position < len(entries):
                heapq.heapreplace(
                    heap, (self._key_of(base_rank, lane, entries[position]), number)
                )
            else:
                heapq.heappop(heap)
        if not heap:
            raise StopIteration
        key, number = heap[0]
        return key, self._streams[number][1][self._positions[number]][3]

    def remaining(self) -> Iterator[QueuedJob]:
        produced = self._heap[0][1] if self._heap else None  # its position is not advanced yet
        for number, ((_, entries), position) in enumerate(
            zip(self._streams, self._positions, strict=True)
        ):
            for entry in entries[position + (number == produced):]:
                yield entry[3]


def _urgent_over_limit(
    queued_jobs: tuple[QueuedJob, ...], runs: list[Run], policy: Policy
) -> set[Id]:
    """Ids of queued urgent jobs beyond their team's urgent limit (they rank as high)."""
    if Priority.URGENT not in set(map(PRIORITY_OF, queued_jobs)):
        return set()  # the common case, told by a pass in C instead of one in Python
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
