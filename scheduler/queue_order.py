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
Each user's jobs in submit order, with the entry penalty ahead of each (`user_streams`), do
not depend on the plan's idle GPUs: a caller that plans many times (the simulator) keeps
them in a `QueueMemo` and rebuilds only the users whose jobs came or went.
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import accumulate
from math import frexp

from scheduler.fair_share import FairShare
from scheduler.instants import to_seconds
from scheduler.policy import HOUR_S, Policy, QueueOrder
from scheduler.quota import QuotaBook, QuotaStanding
from scheduler.snapshot import Id, Instant, Priority, QueuedJob, Run

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

# A queued job as the order keys it: (entry penalty of the same user's earlier queued jobs,
# submit time in seconds, id, the job, its size lane if it is a candidate).
Entry = tuple[float, float, Id, QueuedJob, int]


@dataclass(frozen=True, slots=True)
class UserStream:
    """One user's queued jobs in submit order."""

    entries: list[Entry]
    jobs: tuple[QueuedJob, ...]
    # The class rank (before urgent limits) all of them share; None when they differ.
    rank: int | None


def user_streams(
    queued_jobs: tuple[QueuedJob, ...], policy: Policy
) -> dict[tuple[Id, Id], UserStream]:
    """Each (team, user)'s queued jobs in submit order as entries; users in the order a pass
    over the whole queue in submit order meets them."""
    return QueueMemo().streams(queued_jobs, policy)


# What a job contributes to its user's stream, worked out once per job: its submit order,
# the rest of its entry, and the entry penalty it adds for the user's later jobs.
_Facts = tuple[Instant, Id, float, QueuedJob, int, float]
_SUBMIT_ORDER_OF_FACTS = operator.itemgetter(0, 1)


def _facts(job: QueuedJob, policy: Policy) -> _Facts:
    job_gpu_s = job.gpus_needed * (job.estimated_duration_s or policy.default_estimate_s)
    lane = 0
    base_s = policy.size_lane_base_gpu_s
    if policy.size_lane_weight and job_gpu_s > base_s:
        # The doubling class above the base: ceil(log2(ratio)), from frexp in C.
        mantissa, exponent = frexp(job_gpu_s / base_s)
        lane = exponent - 1 if mantissa == 0.5 else exponent
    submitted = job.submitted_at
    return (
        submitted,
        job.id,
        submitted if submitted.__class__ is float else to_seconds(submitted),
        job,
        lane,
        job_gpu_s * policy.entry_penalty,
    )


class QueueMemo:
    """`user_streams` kept across plans by a caller that plans many times over a queue that
    changes by a few jobs at a time (the simulator, through `IndexCache`): only the users
    whose jobs came or went are rebuilt, from facts worked out once per job, by C loops
    (sort, zip, running sum). Jobs are told apart by identity (the caller keeps an unchanged
    job as the same object); the result must not be mutated."""

    __slots__ = ("_facts", "_first", "_ordered", "_policy", "_streams", "_user_jobs")

    def __init__(self) -> None:
        self._policy: Policy | None = None
        # id(job) → its facts; holding the job keeps its id from being reused meanwhile.
        self._facts: dict[int, _Facts] = {}
        self._user_jobs: dict[tuple[Id, Id], set[int]] = {}
        self._streams: dict[tuple[Id, Id], UserStream] = {}
        # User → the submit order of their first job (users are listed in that order).
        self._first: dict[tuple[Id, Id], tuple[Instant, Id]] = {}
        self._ordered: dict[tuple[Id, Id], UserStream] = {}

    def streams(
        self, queued_jobs: tuple[QueuedJob, ...], policy: Policy
    ) -> dict[tuple[Id, Id], UserStream]:
        if policy is not self._policy:
            self.__init__()
            self._policy = policy
        current = dict(zip(map(id, queued_jobs), queued_jobs, strict=True))
        facts = self._facts
        changed = current.keys() ^ facts.keys()
        if not changed:
            return self._ordered
        dirty = set()
        for identity in changed:
            job = current.get(identity)
            if job is None:
                job = facts.pop(identity)[3]
                self._user_jobs[(job.team, job.user)].discard(identity)
            else:
                facts[identity] = _facts(job, policy)
                self._user_jobs.setdefault((job.team, job.user), set()).add(identity)
            dirty.add((job.team, job.user))
        for user_key in dirty:
            members = self._user_jobs[user_key]
            if not members:
                del self._user_jobs[user_key], self._streams[user_key], self._first[user_key]
                continue
            ordered = sorted(map(facts.__getitem__, members), key=_SUBMIT_ORDER_OF_FACTS)
            _, ids, seconds, jobs, lanes, penalties = zip(*ordered, strict=True)
            # Each job's entry penalty: the sum of its predecessors', added in submit order
            # from 0 (the running sum yields one value more than there are jobs).
            ranks = set(map(CLASS_RANK.__getitem__, map(PRIORITY_OF, jobs)))
            self._streams[user_key] = UserStream(
                entries=list(
                    zip(accumulate(penalties, initial=0.0), seconds, ids, jobs, lanes, strict=False)
                ),
                jobs=jobs,
                rank=ranks.pop() if len(ranks) == 1 else None,
            )
            self._first[user_key] = _SUBMIT_ORDER_OF_FACTS(ordered[0])
        self._ordered = {
            user_key: self._streams[user_key]
            for user_key in sorted(self._streams, key=self._first.__getitem__)
        }
        return self._ordered


def order_queue(
    *,
    queued_jobs: tuple[QueuedJob, ...],
    runs: list[Run],
    fair_share: Callable[[Iterable[tuple[Id, Id]]], FairShare],
    quota: QuotaBook,
    classify: Callable[[QueuedJob], int | None],
    now_s: float,
    policy: Policy,
    memo: QueueMemo | None = None,
) -> tuple[Ordered, Ordered]:
    """Two lazy orders, best first, of (key, job): the jobs `classify` calls CANDIDATE and
    those it calls PROTECT_ONLY (None: left out). Keys of both compare with each other, as
    they come from one rule. `fair_share` is called only when needed (FIFO never pays).
    `memo`: a `QueueMemo` the caller owns; it never changes the result."""
    if policy.queue_order == QueueOrder.FIFO:
        # Sorting on the attributes themselves runs in C (datetimes and floats both order
        # correctly).
        by_submit = sorted(queued_jobs, key=_SUBMIT_ORDER)
        return (
            _Fifo(by_submit, classify, CANDIDATE),
            _Fifo(by_submit, classify, PROTECT_ONLY),
        )

    demoted_urgent = _urgent_over_limit(queued_jobs, runs, policy)
    users = (
        user_streams(queued_jobs, policy) if memo is None else memo.streams(queued_jobs, policy)
    )
    # Streams of entries, one per (team, user, class, lane), separately for candidates and
    # protect-only jobs; each in submit order, so its keys never decrease.
    streams: tuple[dict, dict] = ({}, {})
    class_rank = CLASS_RANK
    for (team, user), user_stream in users.items():
        kinds = list(map(classify, user_stream.jobs))
        shared_rank = user_stream.rank
        if shared_rank is not None and (shared_rank != 0 or not demoted_urgent):
            # All of one class: when all are protect-only (or left out), the user's stream
            # is the memo's list as it is, with no pass over its jobs.
            if kinds.count(PROTECT_ONLY) == len(kinds):
                streams[PROTECT_ONLY][(team, user, shared_rank, 0)] = user_stream.entries
                continue
            if kinds.count(None) == len(kinds):
                continue
        for entry, kind in zip(user_stream.entries, kinds, strict=True):
            job = entry[3]
            if kind is None:
                continue
            rank = class_rank[job.priority]
            if rank == 0 and job.id in demoted_urgent:
                rank = HIGH_RANK
            # Lanes order the jobs that can start now; the job to hold GPUs for (EASY) is
            # chosen without them, or wide jobs, last in every lane, would never be held for.
            lane = entry[4] if kind == CANDIDATE else 0
            stream = streams[kind].get((team, user, rank, lane))
            if stream is None:
                streams[kind][(team, user, rank, lane)] = [entry]
            else:
                stream.append(entry)
    if not streams[CANDIDATE] and not streams[PROTECT_ONLY]:
        return _Fifo([], classify, CANDIDATE), _Fifo([], classify, PROTECT_ONLY)

    shares = fair_share(users.keys())
    lane_weight = policy.size_lane_weight
    promotion_s = policy.class_promotion_after_s
    aging_per_s = policy.aging_per_hour / HOUR_S

    def key_of(
        base_rank: int, lane: int, entry: Entry,
        standing: Callable[[Id], QuotaStanding] = quota.standing,
    ) -> OrderKey:
        ahead, submitted_s, job_id, job, _ = entry
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

    teams = {team for team, _ in users}
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
        streams: dict[tuple[Id, Id, int, int], list[Entry]],
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
