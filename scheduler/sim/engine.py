"""Event-driven simulation of a gpubook cluster: a simulated clock and executor around the
very same `plan()` that reconcile calls.

Pure and deterministic: no I/O and no wall clock (the CLI in `scheduler.sim.cli` times
it). Time is float seconds of trace time. The loop:

1. pop every event due at the next instant (job submissions, bookings becoming visible,
   runs ending, plan wake-ups);
2. build a `Snapshot`, call `plan_detailed`, apply the actions with the simulated executor;
   if an action freed GPUs at once (a kill, a release, a non-checkpointable stop), plan
   again at the same instant, as the next reconcile tick would;
3. schedule a wake-up at the plan's `next_wakeup`.

The simulated runner: a run makes progress after a restart overhead (only when resuming
from a checkpoint); on Stop a checkpointable job saves within `CHECKPOINT_SAVE_S` (bounded
by the grace) and keeps its progress, a non-checkpointable one exits at once and loses it;
on Kill the work since the run started is lost. Stopped jobs are requeued with their
original submit time. With `run_aware_booking` the engine also plays the booking service:
a booking is placed on GPUs when it is made, around the runs of that moment. The engine
checks the invariants as it goes and raises `InvariantViolation` on the first breach, so a
bug cannot hide in a metric.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import IntEnum

from scheduler.actions import Action, Kill, Reason, Release, Start, Stop
from scheduler.booking_placement import Occupant, choose_gpus
from scheduler.estimate import estimate_from_recent, grown_estimate, size_class
from scheduler.fair_share import decayed_gpu_seconds
from scheduler.index import IndexCache, topology_of
from scheduler.plan import plan_detailed
from scheduler.policy import Policy
from scheduler.priority_preemption import PREEMPTING_CLASSES
from scheduler.queue_drain import drain_due_s
from scheduler.queue_relief import BUDGETED_REASONS, relief_due_s
from scheduler.sim.calendar import Calendar
from scheduler.snapshot import (
    Drain,
    Gpu,
    Id,
    Priority,
    QueuedJob,
    ReliefHistory,
    Reservation,
    ReservationStatus,
    Run,
    RunKind,
    Snapshot,
    TeamAccount,
    Usage,
)

# How long a checkpointable run needs to save after SIGTERM (capped by its grace).
CHECKPOINT_SAVE_S = 30.0
# How far the run-aware booking service moves a booking to find room (as the workload's).
MAX_BOOKING_SHIFT_S = 7 * 86400.0
# Floating-point slack for comparisons of simulated times.
EPSILON_S = 1e-6
# Re-plans at one instant after actions that free GPUs; a bound against a plan bug looping.
MAX_PLANS_PER_INSTANT = 8


class InvariantViolation(AssertionError):
    """The simulated cluster reached a state the scheduler promises never to reach."""


class _EventKind(IntEnum):
    # Order matters at equal times: runs that end free GPUs before plan looks at them.
    RUN_END = 0
    BOOKING_VISIBLE = 1
    SUBMIT = 2
    WAKEUP = 3


@dataclass(slots=True)
class SimJob:
    id: int
    user: str
    team: str
    gpus: int
    submit_s: float
    duration_s: float
    checkpointable: bool = True
    booking_id: int | None = None
    progress_s: float = 0.0
    times_preempted: int = 0
    first_start_s: float | None = None
    completed_s: float | None = None
    estimate_s: float | None = None
    priority: Priority = Priority.MEDIUM


@dataclass(frozen=True, slots=True)
class Booking:
    id: int
    job_id: int
    gpu_ids: tuple[Id, ...]
    start_s: float
    end_s: float
    booked_at_s: float
    team: str
    user: str


@dataclass(slots=True)
class _LiveRun:
    run: Run
    job: SimJob
    overhead_s: float
    natural_end_s: float
    end_s: float
    end_how: str  # "completed", "checkpointed"


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One finished run, for the report."""

    run_id: int
    job_id: int
    kind: RunKind
    gpus: int
    start_s: float
    end_s: float
    overhead_s: float
    useful_s: float
    how: str  # completed, checkpointed, killed, stopped_lost


@dataclass(frozen=True, slots=True)
class ActionRecord:
    at_s: float
    action: Action


@dataclass(slots=True)
class SimulationResult:
    jobs: dict[int, SimJob]
    bookings: list[Booking]
    run_records: list[RunRecord]
    actions: list[ActionRecord]
    reserved_start_s: dict[int, float]
    released: dict[int, tuple[float, Reason]]
    queue_length: list[tuple[float, int]]
    team_charges_gpu_s: dict[str, float]
    plan_calls: int
    end_s: float


@dataclass(slots=True)
class SimulationConfig:
    gpus: tuple[Gpu, ...]
    policy: Policy
    restart_overhead_s: float = 0.0
    # Per team: the share used for fair share and the quota (GPU-seconds) for the replay.
    team_quota_gpu_s: dict[str, float] = field(default_factory=dict)
    use_estimator: bool = True
    # Hand the remaining quota to plan (True) or only use quotas as fair-share shares and
    # check the charges after the run (False: a trace has no quotas, and leases would stop
    # long jobs that the trace ran in one go).
    enforce_quotas: bool = False
    record_actions: bool = False
    # The booking service places each booking when it is made, on the node whose GPUs it
    # would cost least to clear at the slot's start (`scheduler.booking_placement`: no work
    # thrown away, then no restart, then no work at risk, then the first node, which keeps
    # the last nodes free of bookings), instead of using the GPUs the workload chose blind
    # to the runs.
    run_aware_booking: bool = False
    # With run_aware_booking: the step to the next slot when a booking's slot is full.
    booking_shift_s: float = 1800.0
    # Called with (now, snapshot) before the first plan of each instant that plans, e.g. to
    # measure queue estimates against what then happens. It must not change anything.
    observer: Callable[[float, Snapshot], None] | None = None


class Simulation:
    def __init__(
        self, config: SimulationConfig, jobs: Iterable[SimJob], bookings: Iterable[Booking]
    ) -> None:
        self.config = config
        self.policy = config.policy
        self.gpus = config.gpus
        self.gpu_ids = {gpu.id for gpu in self.gpus}
        self._max_node_size = topology_of(tuple(self.gpus)).max_node_size
        self.jobs: dict[int, SimJob] = {job.id: job for job in jobs}
        self.bookings = sorted(bookings, key=lambda booking: (booking.booked_at_s, booking.id))
        self.booking_by_id = {booking.id: booking for booking in self.bookings}
        self._booking_position = {booking.id: n for n, booking in enumerate(self.bookings)}
        self.events: list[tuple[float, int, int, int]] = []
        self.sequence = 0
        self.queue: dict[int, QueuedJob] = {}
        self.reservations: dict[int, Reservation] = {}
        self.runs: dict[int, _LiveRun] = {}
        self.gpu_holder: dict[Id, int] = {}
        # The run on each held GPU as the booking service sees it, built once per run (the
        # service asks for every free GPU of every node, per booking).
        self.gpu_occupant: dict[Id, Occupant] = {}
        self.next_run_id = 1
        self.usage: dict[tuple[str, str], Usage] = {}
        self.recent_durations: dict[tuple[str, int], deque[float]] = {}
        self.team_charges: dict[str, float] = {team: 0.0 for team in config.team_quota_gpu_s}
        self.calendar = Calendar(self.gpus) if config.run_aware_booking else None
        self.refused_bookings: set[int] = set()
        self.result = SimulationResult(
            jobs=self.jobs,
            bookings=self.bookings,
            run_records=[],
            actions=[],
            reserved_start_s={},
            released={},
            queue_length=[],
            team_charges_gpu_s=self.team_charges,
            plan_calls=0,
            end_s=0.0,
        )
        self.scheduled_wakeups: set[float] = set()
        self.pending_real_events = 0
        self.booking_starts: list[tuple[float, int]] = []
        self._in_progress_cache: tuple[float, dict[Id, int]] | None = None
        self._constant_teams: tuple[TeamAccount, ...] | None = None
        self.reservation_ends: list[tuple[float, int]] = []
        self._reservations_tuple: tuple[Reservation, ...] | None = None
        # Queue relief's budget window (Policy.relief_budget_window_s), as reconcile reads it
        # from the database: when relief stopped runs, and when jobs were first submitted.
        self._relief_stops_s: deque[float] = deque()
        self._submits_s: deque[float] = deque()
        # Queue drains whose job has not started since, by job (reconcile keeps them with
        # the stopped runs): the latest names the drain's target.
        self._drains: dict[Id, list[Drain]] = {}
        # Kept while no run starts, ends or is asked to stop: plan memoises its runs view on it.
        self._runs_tuple: tuple[Run, ...] | None = None
        # The simulator's own memo of plan's indexes (keyed on the tuples it keeps).
        self.index_cache = IndexCache()

    # ----- events

    def _push(self, at_s: float, kind: _EventKind, payload: int) -> None:
        self.sequence += 1
        if kind != _EventKind.WAKEUP:
            self.pending_real_events += 1
        heapq.heappush(self.events, (at_s, int(kind), self.sequence, payload))

    def run(self) -> SimulationResult:
        for job in self.jobs.values():
            if job.booking_id is None:
                self._push(job.submit_s, _EventKind.SUBMIT, job.id)
        for booking in self.bookings:
            self.team_charges[booking.team] = self.team_charges.get(booking.team, 0.0) + len(
                booking.gpu_ids
            ) * (booking.end_s - booking.start_s)
            self._push(booking.booked_at_s, _EventKind.BOOKING_VISIBLE, booking.id)
            heapq.heappush(self.booking_starts, (booking.start_s, booking.id))
        now_s = 0.0
        while self.events:
            now_s = self.events[0][0]
            only_submissions = True
            while self.events and self.events[0][0] <= now_s:
                _, kind, _, payload = heapq.heappop(self.events)
                if kind != _EventKind.WAKEUP:
                    self.pending_real_events -= 1
                # An urgent or high submission may preempt even on a full cluster.
                only_submissions &= kind == _EventKind.SUBMIT and (
                    self.jobs[payload].priority not in PREEMPTING_CLASSES
                    or not self.policy.priority_preemption
                )
                self._handle(now_s, _EventKind(kind), payload)
            self._prune_reservations(now_s)
            if only_submissions and len(self.gpu_holder) == len(self.gpus):
                # A new queued job changes nothing while every GPU is held by a run: plan's
                # stops, kills and releases depend only on runs, reservations and time, and
                # the time-driven ones have their own wake-ups. Skipping is an exact shortcut,
                # once the timers a submission sets (queue relief's and drain's) are set as plan would.
                for due_s in (relief_due_s, drain_due_s):
                    self._wake_at(due_s(
                        queued_jobs=self.queue.values(), max_node_size=self._max_node_size,
                        now_s=now_s, policy=self.policy,
                    ))
                self.result.queue_length.append((now_s, len(self.queue)))
                continue
            self._plan_at(now_s)
            self._check_reservations_started(now_s)
            if (
                self.pending_real_events == 0
                and not self.runs
                and not self.queue
                and not self.reservations
            ):
                break
        self.result.end_s = now_s
        return self.result

    def _check_reservations_started(self, now_s: float) -> None:
        """Every booking that was known at least a grace period ahead has its GPUs free of
        other runs at its start (its own run may already be there)."""
        starts = self.booking_starts
        while starts and starts[0][0] <= now_s:
            start_s, booking_id = heapq.heappop(starts)
            booking = self.booking_by_id[booking_id]
            if (
                booking_id in self.result.released
                or booking_id in self.refused_bookings
                or start_s != booking.start_s  # moved to a later slot when it was made
                or start_s < now_s - EPSILON_S
            ):
                continue
            if booking.start_s - booking.booked_at_s < self.policy.grace_s:
                continue
            for gpu_id in booking.gpu_ids:
                holder = self.gpu_holder.get(gpu_id)
                if holder is not None and self.runs[holder].run.reservation_id != booking_id:
                    raise InvariantViolation(
                        f"GPU {gpu_id} of reservation {booking_id} busy at its start {now_s}"
                    )

    def _handle(self, now_s: float, kind: _EventKind, payload: int) -> None:
        if kind == _EventKind.SUBMIT:
            self._submits_s.append(now_s)
            self._submit(self.jobs[payload], now_s)
        elif kind == _EventKind.BOOKING_VISIBLE:
            booking = self.booking_by_id[payload]
            if self.calendar is not None:
                booking = self._place_booking(booking, now_s)
                if booking is None:
                    return
            self.reservations[booking.id] = Reservation(
                id=booking.id,
                gpu_ids=booking.gpu_ids,
                start=booking.start_s,
                end=booking.end_s,
                team=booking.team,
                user=booking.user,
                status=ReservationStatus.CONFIRMED,
                job_id=booking.job_id,
            )
            heapq.heappush(self.reservation_ends, (booking.end_s, booking.id))
            self._in_progress_cache = None
            self._reservations_tuple = None
        elif kind == _EventKind.RUN_END:
            live = self.runs.get(payload)
            if live is not None and abs(live.end_s - now_s) <= EPSILON_S:
                self._end_run(live, now_s, live.end_how)
        elif kind == _EventKind.WAKEUP:
            self.scheduled_wakeups.discard(now_s)

    def _place_booking(self, booking: Booking, now_s: float) -> Booking | None:
        """Place the booking at its slot or, if earlier bookings took the room there, at the
        first later slot with room (as the workload's booking service does, up to
        `MAX_BOOKING_SHIFT_S`); None if there is none (the job is queued instead)."""
        length_s = booking.end_s - booking.start_s
        start_s = booking.start_s
        while start_s <= booking.start_s + MAX_BOOKING_SHIFT_S:
            gpu_ids = self._cheapest_gpus(len(booking.gpu_ids), start_s, start_s + length_s, now_s)
            if gpu_ids is not None:
                break
            start_s += self.config.booking_shift_s
        else:
            self.refused_bookings.add(booking.id)
            job = self.jobs[booking.job_id]
            job.booking_id = None
            self.team_charges[booking.team] -= len(booking.gpu_ids) * length_s
            self._push(max(booking.start_s, now_s), _EventKind.SUBMIT, job.id)
            return None
        self.calendar.add(gpu_ids, start_s, start_s + length_s)
        placed = replace(booking, gpu_ids=gpu_ids, start_s=start_s, end_s=start_s + length_s)
        self.booking_by_id[booking.id] = placed
        self.bookings[self._booking_position[booking.id]] = placed
        if start_s != booking.start_s:
            # The user's job exists from the booked start on.
            self.jobs[booking.job_id].submit_s = start_s
            heapq.heappush(self.booking_starts, (start_s, booking.id))
        return placed

    def _cheapest_gpus(
        self, needed: int, start_s: float, end_s: float, now_s: float
    ) -> tuple[Id, ...] | None:
        calendar = self.calendar
        placement = choose_gpus(
            free_by_node=(
                (node, calendar.free_on_node(gpu_ids, start_s, end_s))
                for node, gpu_ids in calendar.nodes.items()
            ),
            occupant_of=self.gpu_occupant.get,
            needed=needed,
            start_s=start_s,
            now_s=now_s,
            stop_cost_s=self.config.restart_overhead_s + CHECKPOINT_SAVE_S,
            policy=self.policy,
        )
        return None if placement is None else placement.gpu_ids

    def _prune_reservations(self, now_s: float) -> None:
        ends = self.reservation_ends
        while ends and ends[0][0] <= now_s:
            _, reservation_id = heapq.heappop(ends)
            if self.reservations.pop(reservation_id, None) is not None:
                self._in_progress_cache = None
                self._reservations_tuple = None

    def _submit(self, job: SimJob, now_s: float) -> None:
        if self.config.use_estimator and job.estimate_s is None:
            recent = self.recent_durations.get((job.user, size_class(job.gpus)))
            if recent:
                job.estimate_s = estimate_from_recent(recent, self.policy.default_estimate_s)
        estimate_s = job.estimate_s
        if estimate_s is not None and job.progress_s > 0:
            # A resumed job is expected to need what is left of its estimate.
            estimate_s = max(estimate_s - job.progress_s, self.config.restart_overhead_s + 60.0)
        self.queue[job.id] = QueuedJob(
            id=job.id,
            team=job.team,
            user=job.user,
            gpus_needed=job.gpus,
            submitted_at=job.submit_s,
            estimated_duration_s=estimate_s,
            checkpointable=job.checkpointable,
            times_preempted=job.times_preempted,
            priority=job.priority,
        )

    # ----- planning

    def _team_accounts(self, now_s: float) -> tuple[TeamAccount, ...]:
        if not self.config.enforce_quotas:
            if self._constant_teams is None:
                self._constant_teams = tuple(
                    TeamAccount(team=team, share=quota)
                    for team, quota in sorted(self.config.team_quota_gpu_s.items())
                )
            return self._constant_teams
        factor = self.policy.usage_factor
        running_charge: dict[str, float] = {}
        for live in self.runs.values():
            if live.run.kind == RunKind.BACKFILL:
                team = live.job.team
                running_charge[team] = running_charge.get(team, 0.0) + len(live.run.gpu_ids) * (
                    now_s - live.run.started_at
                ) * factor
        return tuple(
            TeamAccount(
                team=team,
                share=quota,
                quota_remaining_gpu_s=(
                    quota - self.team_charges.get(team, 0.0) - running_charge.get(team, 0.0)
                ),
            )
            for team, quota in sorted(self.config.team_quota_gpu_s.items())
        )

    def snapshot(self, now_s: float) -> Snapshot:
        teams = self._team_accounts(now_s)
        if self._reservations_tuple is None:
            # Kept while unchanged: plan memoises its reservation index on this tuple.
            self._reservations_tuple = tuple(self.reservations.values())
        if self._runs_tuple is None:
            self._runs_tuple = tuple(live.run for live in self.runs.values())
        return Snapshot(
            gpus=self.gpus,
            reservations=self._reservations_tuple,
            queued_jobs=tuple(self.queue.values()),
            runs=self._runs_tuple,
            usage=tuple(self.usage.values()),
            teams=teams,
            relief_history=self._relief_history(now_s),
            drains=self._live_drains(now_s),
        )

    def _relief_history(self, now_s: float) -> ReliefHistory:
        since_s = now_s - self.policy.relief_budget_window_s
        for moments in (self._relief_stops_s, self._submits_s):
            while moments and moments[0] <= since_s:
                moments.popleft()
        return ReliefHistory(stops=tuple(self._relief_stops_s), jobs_submitted=len(self._submits_s))

    def _live_drains(self, now_s: float) -> tuple[Drain, ...]:
        """The drains within the budget window, as reconcile reads them."""
        since_s = now_s - self.policy.relief_budget_window_s
        return tuple(
            drain for drains in self._drains.values() for drain in drains if drain.at > since_s
        )

    def _plan_at(self, now_s: float) -> None:
        next_wakeup = None
        if self.config.observer is not None:
            self.config.observer(now_s, self.snapshot(now_s))
        for _ in range(MAX_PLANS_PER_INSTANT):
            result = plan_detailed(
                self.snapshot(now_s), now_s, self.policy, cache=self.index_cache
            )
            self.result.plan_calls += 1
            next_wakeup = result.next_wakeup
            freed = False
            for action in result.actions:
                freed |= self._apply(action, now_s)
            if not freed:
                break
        else:
            raise InvariantViolation(f"plan did not settle at t={now_s}")
        self.result.queue_length.append((now_s, len(self.queue)))
        if next_wakeup is not None:
            self._wake_at(next_wakeup)

    def _wake_at(self, at_s: float) -> None:
        if at_s < math.inf and at_s not in self.scheduled_wakeups:
            self.scheduled_wakeups.add(at_s)
            self._push(at_s, _EventKind.WAKEUP, 0)

    # ----- the simulated executor

    def _apply(self, action: Action, now_s: float) -> bool:
        """Apply one action; True when GPUs became free at once."""
        if self.config.record_actions:
            self.result.actions.append(ActionRecord(now_s, action))
        if isinstance(action, Start):
            self._start(action, now_s)
            return False
        if isinstance(action, Stop):
            return self._stop(action, now_s)
        if isinstance(action, Kill):
            live = self.runs[action.run_id]
            self._check_kill_is_due(live.run, now_s)
            self._end_run(live, now_s, "killed")
            return True
        if isinstance(action, Release):
            self._release(action, now_s)
            return True
        raise TypeError(f"unknown action {action!r}")

    def _check_kill_is_due(self, run: Run, now_s: float) -> None:
        """A kill comes only at a deadline the run was told about: its must_end_by, or the
        end of the grace period of a stop it received."""
        at_must_end = run.must_end_by is not None and now_s >= run.must_end_by - EPSILON_S
        after_grace = (
            run.stop_requested_at is not None
            and now_s >= run.stop_requested_at + self.policy.grace_s - EPSILON_S
        )
        if not (at_must_end or after_grace):
            raise InvariantViolation(f"run {run.id} killed without notice at t={now_s}: {run}")

    def _in_progress_reservations(self, now_s: float) -> dict[Id, int]:
        cached = self._in_progress_cache
        if cached is not None and cached[0] == now_s:
            return cached[1]
        by_gpu: dict[Id, int] = {}
        for reservation in self.reservations.values():
            if reservation.start <= now_s < reservation.end:
                for gpu_id in reservation.gpu_ids:
                    by_gpu[gpu_id] = reservation.id
        self._in_progress_cache = (now_s, by_gpu)
        return by_gpu

    def _start(self, action: Start, now_s: float) -> None:
        if action.kind == RunKind.RESERVED:
            reservation = self.reservations[action.reservation_id]
            job = self.jobs[reservation.job_id]
            # A job requeued after an earlier slot resumes here, not also from the queue.
            self.queue.pop(job.id, None)
            self.result.reserved_start_s.setdefault(reservation.id, now_s)
            if not (reservation.start <= now_s < reservation.end):
                raise InvariantViolation(f"reserved run started outside its slot: {action}")
        else:
            job = self.jobs[action.job_id]
            if job.id not in self.queue:
                raise InvariantViolation(f"started a job that is not queued: {action}")
            del self.queue[job.id]
            self._drains.pop(job.id, None)  # a target stays one until it starts
        if len(action.gpu_ids) != job.gpus and action.kind == RunKind.BACKFILL:
            raise InvariantViolation(f"wrong GPU count for job {job.id}: {action}")
        for gpu_id in action.gpu_ids:
            if gpu_id not in self.gpu_ids:
                raise InvariantViolation(f"unknown GPU {gpu_id} in {action}")
            if gpu_id in self.gpu_holder:
                raise InvariantViolation(
                    f"GPU {gpu_id} in two runs at t={now_s}: {self.gpu_holder[gpu_id]} and {action}"
                )
            holder_reservation = self._in_progress_reservations(now_s).get(gpu_id)
            if holder_reservation is not None and holder_reservation != action.reservation_id:
                raise InvariantViolation(
                    f"{action} takes a GPU of reservation {holder_reservation} at t={now_s}"
                )
        must_end_s = action.must_end_by
        if must_end_s is not None and must_end_s <= now_s:
            raise InvariantViolation(f"run started past its must_end_by: {action}")
        run_id = self.next_run_id
        self.next_run_id += 1
        overhead_s = self.config.restart_overhead_s if job.progress_s > 0 else 0.0
        natural_end_s = now_s + overhead_s + (job.duration_s - job.progress_s)
        run = Run(
            id=run_id,
            job_id=job.id,
            gpu_ids=action.gpu_ids,
            kind=action.kind,
            started_at=now_s,
            team=job.team,
            user=job.user,
            reservation_id=action.reservation_id,
            must_end_by=action.must_end_by,
            estimated_end=action.estimated_end,
            priority=job.priority,
            checkpointable=job.checkpointable,
            times_preempted=job.times_preempted,
        )
        live = _LiveRun(run, job, overhead_s, natural_end_s, natural_end_s, "completed")
        self.runs[run_id] = live
        self._runs_tuple = None
        # Its estimate counts for the booking service only when it comes from history (a
        # default says nothing).
        occupant = Occupant(
            run_id=run_id,
            gpus=len(action.gpu_ids),
            started_at_s=now_s,
            checkpointable=job.checkpointable,
            expected_end_s=action.estimated_end if job.estimate_s is not None else None,
            reserved=action.kind == RunKind.RESERVED,
        )
        for gpu_id in action.gpu_ids:
            self.gpu_holder[gpu_id] = run_id
            self.gpu_occupant[gpu_id] = occupant
        if job.first_start_s is None:
            job.first_start_s = now_s
        self._push(natural_end_s, _EventKind.RUN_END, run_id)

    def _stop(self, action: Stop, now_s: float) -> bool:
        live = self.runs[action.run_id]
        if live.run.stop_requested_at is not None:
            raise InvariantViolation(f"stop sent twice: {action}")
        if action.grace_s < self.policy.grace_s - EPSILON_S:
            raise InvariantViolation(f"stop with less than the grace period: {action} at {now_s}")
        live.run = replace(live.run, stop_requested_at=now_s)
        if action.reason in BUDGETED_REASONS:
            self._relief_stops_s.append(now_s)
        if action.reason == Reason.QUEUE_DRAIN:
            self._drains.setdefault(action.for_job_id, []).append(
                Drain(at=now_s, job_id=action.for_job_id, gpu_ids=live.run.gpu_ids)
            )
        self._runs_tuple = None
        if not live.job.checkpointable:
            self._end_run(live, now_s, "stopped_lost")
            return True
        save_end_s = now_s + min(CHECKPOINT_SAVE_S, action.grace_s)
        if save_end_s < live.end_s:
            live.end_s = save_end_s
            live.end_how = "checkpointed"
            self._push(save_end_s, _EventKind.RUN_END, live.run.id)
        return False

    def _release(self, action: Release, now_s: float) -> None:
        reservation = self.reservations.pop(action.reservation_id)
        self._in_progress_cache = None
        self._reservations_tuple = None
        self.result.released[reservation.id] = (now_s, action.reason)
        refund = len(reservation.gpu_ids) * max(reservation.end - now_s, 0.0)
        self.team_charges[reservation.team] = self.team_charges.get(reservation.team, 0.0) - refund

    def _end_run(self, live: _LiveRun, now_s: float, how: str) -> None:
        run = live.run
        job = live.job
        del self.runs[run.id]
        self._runs_tuple = None
        for gpu_id in run.gpu_ids:
            del self.gpu_holder[gpu_id]
            del self.gpu_occupant[gpu_id]
        if run.must_end_by is not None and now_s > run.must_end_by + EPSILON_S:
            raise InvariantViolation(f"run {run.id} outlived must_end_by ({now_s})")
        elapsed_s = now_s - run.started_at
        work_s = max(elapsed_s - live.overhead_s, 0.0)
        useful_s = 0.0
        if how == "completed":
            useful_s = job.duration_s - job.progress_s
            job.progress_s = job.duration_s
            job.completed_s = now_s
            recent = self.recent_durations.setdefault(
                (job.user, size_class(job.gpus)), deque(maxlen=2)
            )
            recent.append(job.duration_s)
            if run.reservation_id is not None and run.reservation_id in self.reservations:
                reservation = self.reservations[run.reservation_id]
                self.reservations[reservation.id] = replace(reservation, job_finished=True)
                self._reservations_tuple = None
        elif how == "checkpointed":
            useful_s = min(work_s, job.duration_s - job.progress_s)
            job.progress_s += useful_s
        else:
            # killed (work since the last checkpoint, i.e. this run's start, is lost) or a
            # non-checkpointable job stopped (it restarts from scratch).
            if not job.checkpointable:
                job.progress_s = 0.0
        if how != "completed":
            if run.kind == RunKind.BACKFILL:
                job.times_preempted += 1
            if self.config.use_estimator:
                job.estimate_s = grown_estimate(
                    job.estimate_s, elapsed_s, self.policy.default_estimate_s
                )
            self._submit(job, now_s)
        gpus = len(run.gpu_ids)
        factor = self.policy.usage_factor if run.kind == RunKind.BACKFILL else 1.0
        if run.kind == RunKind.BACKFILL:
            self.team_charges[job.team] = (
                self.team_charges.get(job.team, 0.0) + gpus * elapsed_s * factor
            )
        key = (job.team, job.user)
        previous = self.usage.get(key)
        decayed = 0.0
        if previous is not None:
            decayed = decayed_gpu_seconds(
                previous.gpu_seconds,
                float(previous.as_of),
                now_s,
                self.policy.fair_share_half_life_s,
            )
        self.usage[key] = Usage(job.team, job.user, decayed + gpus * elapsed_s * factor, now_s)
        self.result.run_records.append(
            RunRecord(
                run_id=run.id,
                job_id=job.id,
                kind=run.kind,
                gpus=gpus,
                start_s=run.started_at,
                end_s=now_s,
                overhead_s=min(live.overhead_s, elapsed_s),
                useful_s=useful_s,
                how=how,
            )
        )
