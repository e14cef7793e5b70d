"""Indexes built once per plan: the GPU topology, the runs by GPU and the live reservations
per GPU.

These turn the snapshot's flat tuples into dictionaries so that every policy step is a
lookup instead of a scan. No module state: a caller that plans many times over the same
(immutable) tuples, like the simulator, may hand plan an `IndexCache` it owns, which reuses
the topology of the same `gpus` tuple, the runs view of the same `runs` tuple and the
reservation index of the same `reservations` tuple while it stays exact. Reservations cannot
overlap on a GPU (the database guarantees it), so per GPU one reservation can be in progress
and the rest lie ahead: "the one now" and "the next start" say all plan needs.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field

from scheduler.instants import INFINITY, to_seconds
from scheduler.snapshot import (
    LIVE_RESERVATION_STATUSES,
    Gpu,
    GpuState,
    Id,
    Reservation,
    Run,
)

_RUN_ID = operator.attrgetter("id")


@dataclass(frozen=True, slots=True)
class Topology:
    gpu_by_id: dict[Id, Gpu]
    # Node id → its GPUs ordered by index; nodes in sorted order.
    node_gpus: dict[Id, tuple[Gpu, ...]]
    # The same, as GPU ids (the hot loops look up ids).
    node_gpu_ids: dict[Id, tuple[Id, ...]]
    node_sizes: dict[Id, int]
    max_node_size: int
    active_gpu_count: int
    active_gpu_ids: frozenset[Id]
    maintenance_gpu_ids: frozenset[Id]


def topology_of(gpus: tuple[Gpu, ...]) -> Topology:
    """The topology of `gpus`."""
    by_node: dict[Id, list[Gpu]] = {}
    for gpu in gpus:
        by_node.setdefault(gpu.node, []).append(gpu)
    node_gpus = {
        node: tuple(sorted(by_node[node], key=lambda gpu: (gpu.index, gpu.id)))
        for node in sorted(by_node)
    }
    topology = Topology(
        gpu_by_id={gpu.id: gpu for gpu in gpus},
        node_gpus=node_gpus,
        node_gpu_ids={node: tuple(gpu.id for gpu in members) for node, members in node_gpus.items()},
        node_sizes={node: len(members) for node, members in node_gpus.items()},
        max_node_size=max((len(node) for node in node_gpus.values()), default=0),
        active_gpu_count=sum(1 for gpu in gpus if gpu.state == GpuState.ACTIVE),
        active_gpu_ids=frozenset(gpu.id for gpu in gpus if gpu.state == GpuState.ACTIVE),
        maintenance_gpu_ids=frozenset(
            gpu.id for gpu in gpus if gpu.state == GpuState.MAINTENANCE
        ),
    )
    return topology


@dataclass(frozen=True, slots=True)
class RunsView:
    """The runs by id, and what they hold. A plan copies `occupied` and `running_jobs`
    before it adds its own starts to them; the rest it only reads."""

    runs: list[Run]
    # Reservation → its (lowest-id) run.
    runs_by_reservation: dict[Id, Run]
    # GPU → the (lowest-id) run holding it.
    occupied: dict[Id, Id]
    running_jobs: frozenset[Id]


def runs_view_of(runs: tuple[Run, ...]) -> RunsView:
    ordered: list[Run] = sorted(runs, key=_RUN_ID)
    runs_by_reservation: dict[Id, Run] = {}
    occupied: dict[Id, Id] = {}
    for run in ordered:
        if run.reservation_id is not None:
            runs_by_reservation.setdefault(run.reservation_id, run)
        for gpu_id in run.gpu_ids:
            occupied.setdefault(gpu_id, run.id)
    return RunsView(
        ordered, runs_by_reservation, occupied, frozenset(run.job_id for run in ordered)
    )


@dataclass(slots=True)
class LiveReservation:
    reservation: Reservation
    start_s: float
    end_s: float


@dataclass(slots=True)
class ReservationIndex:
    """Live reservations (live status, end after now), looked up by id and by GPU."""

    # Reservations whose slot has begun, by start then id.
    in_progress: list[LiveReservation] = field(default_factory=list)
    by_id: dict[Id, LiveReservation] = field(default_factory=dict)
    # GPU → the reservation in progress on it now.
    in_progress_on_gpu: dict[Id, LiveReservation] = field(default_factory=dict)
    # GPU → the earliest start of a reservation that has not begun yet.
    next_start_on_gpu: dict[Id, float] = field(default_factory=dict)
    # The earliest future start and the earliest end: the times the picture changes.
    earliest_future_start_s: float = INFINITY
    earliest_end_s: float = INFINITY
    # The earliest future start of a reservation with no job attached (no-show timers).
    earliest_jobless_future_start_s: float = INFINITY

    @classmethod
    def build(cls, reservations: tuple[Reservation, ...], now_s: float) -> ReservationIndex:
        index = cls()
        by_id = index.by_id
        next_start = index.next_start_on_gpu
        in_progress_on_gpu = index.in_progress_on_gpu
        earliest_future = earliest_end = earliest_jobless = INFINITY
        live_statuses = LIVE_RESERVATION_STATUSES
        for reservation in reservations:
            if reservation.status not in live_statuses:
                continue
            end = reservation.end
            end_s = end if end.__class__ is float else to_seconds(end)
            if end_s <= now_s:
                continue
            start = reservation.start
            start_s = start if start.__class__ is float else to_seconds(start)
            item = LiveReservation(reservation, start_s, end_s)
            by_id[reservation.id] = item
            if end_s < earliest_end:
                earliest_end = end_s
            if start_s <= now_s:
                index.in_progress.append(item)
                for gpu_id in reservation.gpu_ids:
                    in_progress_on_gpu[gpu_id] = item
            else:
                if start_s < earliest_future:
                    earliest_future = start_s
                if reservation.job_id is None and start_s < earliest_jobless:
                    earliest_jobless = start_s
                for gpu_id in reservation.gpu_ids:
                    if start_s < next_start.get(gpu_id, INFINITY):
                        next_start[gpu_id] = start_s
        index.in_progress.sort(key=lambda item: (item.start_s, item.reservation.id))
        index.earliest_future_start_s = earliest_future
        index.earliest_end_s = earliest_end
        index.earliest_jobless_future_start_s = earliest_jobless
        return index

    def with_future(self, reservation: Reservation, now_s: float) -> ReservationIndex | None:
        """A copy that also holds `reservation`, as `build` would with it appended to the
        reservations, if it has not begun by `now_s` (None otherwise: not handled here)."""
        if reservation.status not in LIVE_RESERVATION_STATUSES:
            return self
        start, end = reservation.start, reservation.end
        start_s = start if start.__class__ is float else to_seconds(start)
        end_s = end if end.__class__ is float else to_seconds(end)
        if start_s <= now_s or end_s <= now_s:
            return None
        by_id = dict(self.by_id)
        by_id[reservation.id] = LiveReservation(reservation, start_s, end_s)
        next_start = dict(self.next_start_on_gpu)
        for gpu_id in reservation.gpu_ids:
            if start_s < next_start.get(gpu_id, INFINITY):
                next_start[gpu_id] = start_s
        return ReservationIndex(
            in_progress=self.in_progress,
            by_id=by_id,
            in_progress_on_gpu=self.in_progress_on_gpu,
            next_start_on_gpu=next_start,
            earliest_future_start_s=min(self.earliest_future_start_s, start_s),
            earliest_end_s=min(self.earliest_end_s, end_s),
            earliest_jobless_future_start_s=(
                self.earliest_jobless_future_start_s
                if reservation.job_id is not None
                else min(self.earliest_jobless_future_start_s, start_s)
            ),
        )

    def without_in_progress(self, reservation_ids: set[Id]) -> ReservationIndex:
        """A copy that forgets released reservations: their GPUs are free for the rest of
        the plan. A copy, because an index may be shared through an `IndexCache`."""
        by_id = dict(self.by_id)
        in_progress_on_gpu = dict(self.in_progress_on_gpu)
        for reservation_id in reservation_ids:
            item = by_id.pop(reservation_id)
            for gpu_id in item.reservation.gpu_ids:
                if in_progress_on_gpu.get(gpu_id) is item:
                    del in_progress_on_gpu[gpu_id]
        return ReservationIndex(
            in_progress=[
                item for item in self.in_progress if item.reservation.id not in reservation_ids
            ],
            by_id=by_id,
            in_progress_on_gpu=in_progress_on_gpu,
            next_start_on_gpu=self.next_start_on_gpu,
            earliest_future_start_s=self.earliest_future_start_s,
            earliest_end_s=self.earliest_end_s,
            earliest_jobless_future_start_s=self.earliest_jobless_future_start_s,
        )

    def earliest_foreign_start(self, gpu_ids: tuple[Id, ...], own: Id | None) -> float:
        """The earliest start of a live reservation on any of `gpu_ids` other than `own`
        (one in progress counts with its start, i.e. it is already due)."""
        earliest = INFINITY
        in_progress_on_gpu = self.in_progress_on_gpu
        next_start = self.next_start_on_gpu
        for gpu_id in gpu_ids:
            item = in_progress_on_gpu.get(gpu_id)
            if item is not None and item.reservation.id != own and item.start_s < earliest:
                earliest = item.start_s
            start_s = next_start.get(gpu_id, INFINITY)
            if start_s < earliest:
                earliest = start_s
        return earliest


def _same_or_built(cached: tuple | None, key: tuple, build: Callable) -> tuple:
    """`cached`, a (key, value) pair, if its key is `key` itself; else `key` and its build."""
    return cached if cached is not None and cached[0] is key else (key, build(key))


@dataclass(slots=True)
class IndexCache:
    """Memo of the indexes across plans, owned by the caller that passes it to plan.

    Keyed on the identity of the snapshot's tuples, so the owner must build a new tuple
    whenever the GPUs, reservations or runs change (the simulator does). Results are exactly
    what `topology_of`, `runs_view_of` and `ReservationIndex.build` would return; callers must
    not mutate them.
    """

    _topology: tuple[tuple[Gpu, ...], Topology] | None = None
    _runs: tuple[tuple[Run, ...], RunsView] | None = None
    _index: tuple[tuple[Reservation, ...], float, ReservationIndex] | None = None

    def topology(self, gpus: tuple[Gpu, ...]) -> Topology:
        self._topology = _same_or_built(self._topology, gpus, topology_of)
        return self._topology[1]

    def runs_view(self, runs: tuple[Run, ...]) -> RunsView:
        self._runs = _same_or_built(self._runs, runs, runs_view_of)
        return self._runs[1]

    def reservation_index(
        self, reservations: tuple[Reservation, ...], now_s: float
    ) -> ReservationIndex:
        """The index of the same tuple stays exact while no reservation starts or ends,
        i.e. from the time it was built until the earliest future start or end. A tuple that
        is the cached one with one booking appended (a booking made, the simulator's most
        frequent change) extends the cached index when that booking has not begun."""
        cached = self._index
        if cached is not None:
            previous, built_at_s, index = cached
            if built_at_s <= now_s < min(index.earliest_future_start_s, index.earliest_end_s):
                if previous is reservations:
                    return index
                if len(reservations) == len(previous) + 1 and all(
                    map(operator.is_, previous, reservations)
                ):
                    extended = index.with_future(reservations[-1], now_s)
                    if extended is not None:
                        self._index = (reservations, built_at_s, extended)
                        return extended
        index = ReservationIndex.build(reservations, now_s)
        self._index = (reservations, now_s, index)
        return index
