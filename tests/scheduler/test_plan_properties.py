"""Invariants of plan() over random snapshots (hypothesis).

For any snapshot and any moment:
* starts use existing, active, free GPUs, each GPU at most once, never a GPU of another
  reservation in progress; backfill starts end before the next reservation on their GPUs
  and leave at least a grace period before their stop;
* stops come with kill_at = now + grace_s, grace_s <= the policy's grace, never twice;
* a run past its deadline is killed, and a kill only comes at a deadline;
* the plan is deterministic: same result twice, and for any order of the snapshot's tuples;
* idempotent: once the stops are recorded, planning again sends none of them again;
* the fast deadline loop agrees with the general rule (slot_end.run_deadline);
* datetimes in give the same plan as float seconds in.
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import (
    GpuState,
    Kill,
    Policy,
    Priority,
    QueuedJob,
    Release,
    Reservation,
    ReservationStatus,
    Run,
    RunKind,
    Snapshot,
    Start,
    Stop,
    TeamAccount,
    Usage,
    plan,
    plan_detailed,
)
from scheduler.index import ReservationIndex, topology_of
from scheduler.slot_end import plan_stops, run_deadline
from tests.scheduler.builders import apply, gpus

SLOT_S = 600.0
GRACE_S = 60.0
POLICIES = [
    Policy(grace_s=GRACE_S, min_preemptible_runtime_s=300.0, allow_multi_node=True),
    Policy(grace_s=GRACE_S, backfill=False, use_estimates=False),
    Policy(grace_s=GRACE_S, no_show_after_s=120.0, backfill_protected_jobs=2),
]
TEAMS = ["vision", "speech"]
USERS = ["alice", "bob", "carol"]


def whole_seconds(low: float, high: float) -> st.SearchStrategy[float]:
    """Times in whole seconds: exact both as floats and as datetimes, so the two kinds of
    input can be compared without rounding noise."""
    return st.integers(int(low), int(high)).map(float)


@st.composite
def snapshots(draw) -> tuple[Snapshot, float]:
    nodes = draw(st.integers(1, 3))
    per_node = draw(st.integers(1, 4))
    states = {}
    for node in range(nodes):
        for index in range(per_node):
            states[node * 100 + index] = draw(
                st.sampled_from([GpuState.ACTIVE] * 6 + [GpuState.DRAINED, GpuState.MAINTENANCE])
            )
    inventory = gpus(nodes=nodes, per_node=per_node, states=states)
    gpu_ids = [gpu.id for gpu in inventory]
    now = draw(st.integers(0, 20)) * SLOT_S / 2 + draw(st.sampled_from([0.0, 1.0, 30.0, 59.0]))

    # Reservations: slot-aligned, never overlapping on a GPU (the database guarantees it).
    reservations: list[Reservation] = []
    booked: dict[int, list[tuple[float, float]]] = {gpu_id: [] for gpu_id in gpu_ids}
    for number in range(draw(st.integers(0, 6))):
        node = draw(st.integers(0, nodes - 1))
        members = draw(st.lists(st.integers(0, per_node - 1), min_size=1, unique=True))
        chosen = tuple(sorted(node * 100 + index for index in members))
        start = draw(st.integers(0, 24)) * SLOT_S
        end = start + draw(st.integers(1, 6)) * SLOT_S
        if any(s < end and start < e for gpu_id in chosen for s, e in booked[gpu_id]):
            continue
        for gpu_id in chosen:
            booked[gpu_id].append((start, end))
        has_job = draw(st.booleans())
        reservations.append(
            Reservation(
                id=number + 1, gpu_ids=chosen, start=start, end=end,
                team=draw(st.sampled_from(TEAMS)), user=draw(st.sampled_from(USERS)),
                status=draw(st.sampled_from([ReservationStatus.CONFIRMED] * 4
                                            + [ReservationStatus.ACTIVE,
                                               ReservationStatus.CANCELLED])),
                job_id=500 + number if has_job else None,
                job_finished=has_job and draw(st.booleans()),
            )
        )

    # Runs on disjoint GPUs; some reserved runs sit in their reservation.
    runs: list[Run] = []
    free = list(gpu_ids)
    draw(st.randoms()).shuffle(free)
    for number in range(draw(st.integers(0, 4))):
        if not free:
            break
        size = draw(st.integers(1, min(3, len(free))))
        taken, free = tuple(sorted(free[:size])), free[size:]
        kind = draw(st.sampled_from(list(RunKind)))
        reservation_id = None
        must_end_by = draw(st.one_of(st.none(), whole_seconds(now - 100, now + 5000)))
        started_at = draw(whole_seconds(max(now - 5000, -5000), now))
        if kind == RunKind.RESERVED:
            candidates = [r for r in reservations if r.start <= now < r.end]
            if candidates and draw(st.booleans()):
                holder = draw(st.sampled_from(candidates))
                reservation_id = holder.id
                must_end_by = holder.end
            else:
                reservation_id = 999
        stop_requested_at = draw(st.one_of(st.none(), whole_seconds(max(now - 200, started_at), now)))
        runs.append(
            Run(
                id=number + 1, job_id=300 + number, gpu_ids=taken, kind=kind,
                started_at=started_at, team=draw(st.sampled_from(TEAMS)),
                user=draw(st.sampled_from(USERS)), reservation_id=reservation_id,
                must_end_by=must_end_by, stop_requested_at=stop_requested_at,
                estimated_end=draw(st.one_of(st.none(), whole_seconds(now - 10, now + 9000))),
                priority=draw(st.sampled_from(list(Priority))),
            )
        )

    queued = [
        QueuedJob(
            id=number + 1, team=draw(st.sampled_from(TEAMS)), user=draw(st.sampled_from(USERS)),
            gpus_needed=draw(st.integers(1, per_node * 2)),
            submitted_at=draw(whole_seconds(now - 90_000, now)),
            priority=draw(st.sampled_from(list(Priority))),
            estimated_duration_s=draw(st.one_of(st.none(), whole_seconds(1, 20_000))),
            checkpointable=draw(st.booleans()),
            times_preempted=draw(st.integers(0, 4)),
            timeout_s=draw(st.one_of(st.none(), whole_seconds(10, 50_000))),
        )
        for number in range(draw(st.integers(0, 8)))
    ]
    usage = [
        Usage(team=team, user=user, gpu_seconds=draw(st.floats(0, 1e6)),
              as_of=draw(whole_seconds(now - 1e6, now)))
        for team in TEAMS for user in USERS if draw(st.booleans())
    ]
    teams = [
        TeamAccount(team=team, share=draw(st.one_of(st.none(), st.floats(0.1, 10))),
                    quota_remaining_gpu_s=draw(st.one_of(st.none(), st.floats(-100, 1e5))),
                    over_quota_allowed=draw(st.booleans()))
        for team in TEAMS if draw(st.booleans())
    ]
    state = Snapshot(
        gpus=inventory, reservations=tuple(reservations), queued_jobs=tuple(queued),
        runs=tuple(runs), usage=tuple(usage), teams=tuple(teams),
    )
    return state, now


def _live_in_progress(state: Snapshot, now: float, released: set) -> dict[int, Reservation]:
    by_gpu = {}
    for reservation in state.reservations:
        if (
            reservation.status in (ReservationStatus.CONFIRMED, ReservationStatus.ACTIVE)
            and reservation.start <= now < reservation.end
            and reservation.id not in released
        ):
            for gpu_id in reservation.gpu_ids:
                by_gpu[gpu_id] = reservation
    return by_gpu


def _next_start(state: Snapshot, gpu_id: int, now: float) -> float:
    return min(
        (
            r.start for r in state.reservations
            if gpu_id in r.gpu_ids and r.start > now and r.end > now
            and r.status in (ReservationStatus.CONFIRMED, ReservationStatus.ACTIVE)
        ),
        default=float("inf"),
    )


def _shuffled(state: Snapshot, seed: int) -> Snapshot:
    shuffle = random.Random(seed)

    def mixed(items: tuple) -> tuple:
        items = list(items)
        shuffle.shuffle(items)
        return tuple(items)

    return Snapshot(
        gpus=mixed(state.gpus), reservations=mixed(state.reservations),
        queued_jobs=mixed(state.queued_jobs), runs=mixed(state.runs), usage=mixed(state.usage),
        teams=mixed(state.teams),
    )


@settings(max_examples=250, deadline=None)
@given(case=snapshots(), policy=st.sampled_from(POLICIES), seed=st.integers(0, 1000))
def test_plan_invariants(case, policy, seed):
    state, now = case
    actions = plan(state, now, policy)
    gpu_by_id = {gpu.id: gpu for gpu in state.gpus}
    held = {gpu_id for run in state.runs for gpu_id in run.gpu_ids}
    runs = {run.id: run for run in state.runs}
    released = {action.reservation_id for action in actions if isinstance(action, Release)}
    in_progress = _live_in_progress(state, now, released)

    # Starts: existing, active, free, each GPU once, never another reservation's GPUs.
    started_gpus = [gpu_id for a in actions if isinstance(a, Start) for gpu_id in a.gpu_ids]
    assert len(started_gpus) == len(set(started_gpus))
    for start in (a for a in actions if isinstance(a, Start)):
        for gpu_id in start.gpu_ids:
            assert gpu_by_id[gpu_id].state == GpuState.ACTIVE
            assert gpu_id not in held
            holder = in_progress.get(gpu_id)
            assert holder is None or holder.id == start.reservation_id
        if start.kind == RunKind.BACKFILL:
            next_start = min(_next_start(state, gpu_id, now) for gpu_id in start.gpu_ids)
            end = start.must_end_by if start.must_end_by is not None else float("inf")
            assert end <= next_start
            assert end - now > policy.grace_s
        else:
            reservation = next(r for r in state.reservations if r.id == start.reservation_id)
            assert start.gpu_ids == reservation.gpu_ids
            assert start.must_end_by == reservation.end

    # Stops and kills.
    stopped = [a.run_id for a in actions if isinstance(a, Stop)]
    killed = [a.run_id for a in actions if isinstance(a, Kill)]
    assert len(stopped) == len(set(stopped))
    assert set(stopped).isdisjoint(killed)
    for stop in (a for a in actions if isinstance(a, Stop)):
        assert runs[stop.run_id].stop_requested_at is None
        assert 0 < stop.grace_s <= policy.grace_s
        assert stop.kill_at == now + stop.grace_s
    for run_id in killed:
        run = runs[run_id]
        at_deadline = run.must_end_by is not None and now >= run.must_end_by
        after_grace = run.stop_requested_at is not None and now >= (
            run.stop_requested_at + policy.grace_s
        )
        in_the_way = any(
            r.start <= now and r.id != run.reservation_id and r.end > now
            and r.status in (ReservationStatus.CONFIRMED, ReservationStatus.ACTIVE)
            for r in state.reservations if set(r.gpu_ids) & set(run.gpu_ids)
        )
        assert at_deadline or after_grace or in_the_way
    for run in state.runs:
        if run.must_end_by is not None and now >= run.must_end_by:
            assert run.id in killed

    # Determinism, also under any order of the inputs.
    assert plan(state, now, policy) == actions
    assert plan(_shuffled(state, seed), now, policy) == actions

    # Idempotence: record the stops, plan again: no stop is sent twice.
    stops_only = [a for a in actions if isinstance(a, Stop)]
    after = apply(state, stops_only, now)
    again = plan(after, now, policy)
    assert not {a.run_id for a in again if isinstance(a, Stop)} & set(stopped)


@settings(max_examples=150, deadline=None)
@given(case=snapshots(), policy=st.sampled_from(POLICIES))
def test_fast_deadline_loop_agrees_with_the_rule(case, policy):
    state, now = case
    runs = sorted(state.runs, key=lambda run: run.id)
    index = ReservationIndex.build(state.reservations, now)
    topology = topology_of(state.gpus)
    deadlines: dict = {}
    kills, stops = plan_stops(runs=runs, index=index, topology=topology, now_s=now,
                              policy=policy, to_instant=float, wakeups=[], deadlines=deadlines)
    reasons = {kill.run_id: kill.reason for kill in kills} | {s.run_id: s.reason for s in stops}
    for run in runs:
        expected = run_deadline(run, index, topology, now, policy)
        assert deadlines[run.id] == expected.at_s
        if run.id in reasons:
            assert reasons[run.id] == expected.reason


EPOCH = datetime(2026, 3, 29, 0, 0, tzinfo=UTC)  # a DST night in Europe: UTC does not care


def _as_datetimes(state: Snapshot) -> Snapshot:
    def moment(value):
        return None if value is None else EPOCH + timedelta(seconds=value)

    return Snapshot(
        gpus=state.gpus,
        reservations=tuple(replace(r, start=moment(r.start), end=moment(r.end))
                           for r in state.reservations),
        queued_jobs=tuple(replace(j, submitted_at=moment(j.submitted_at))
                          for j in state.queued_jobs),
        runs=tuple(replace(r, started_at=moment(r.started_at), must_end_by=moment(r.must_end_by),
                           stop_requested_at=moment(r.stop_requested_at),
                           estimated_end=moment(r.estimated_end)) for r in state.runs),
        usage=tuple(replace(u, as_of=moment(u.as_of)) for u in state.usage),
        teams=state.teams,
    )


@settings(max_examples=100, deadline=None)
@given(case=snapshots(), policy=st.sampled_from(POLICIES))
def test_datetimes_give_the_same_plan_as_seconds(case, policy):
    state, now = case
    # Whole milliseconds, so both kinds of time are exact.
    in_seconds = plan_detailed(state, now, policy)
    in_datetimes = plan_detailed(_as_datetimes(state), EPOCH + timedelta(seconds=now), policy)

    def normalised(action):
        if isinstance(action, Start):
            return replace(
                action,
                must_end_by=None if action.must_end_by is None
                else round((action.must_end_by - EPOCH).total_seconds(), 3)
                if isinstance(action.must_end_by, datetime) else round(action.must_end_by, 3),
                estimated_end=None,
            )
        if isinstance(action, Stop):
            kill_at = action.kill_at
            seconds = (kill_at - EPOCH).total_seconds() if isinstance(kill_at, datetime) else kill_at
            return replace(action, kill_at=round(seconds, 3), grace_s=round(action.grace_s, 3))
        return action

    assert [normalised(a) for a in in_datetimes.actions] == [
        normalised(a) for a in in_seconds.actions
    ]


def test_naive_datetime_now_is_refused():
    import pytest

    with pytest.raises(ValueError, match="timezone-aware"):
        plan(Snapshot(gpus=gpus()), datetime(2026, 1, 1), Policy())


def test_nothing_due_means_no_wakeup_in_either_kind_of_time():
    state = Snapshot(gpus=gpus())
    assert plan_detailed(state, 0.0, Policy()).next_wakeup is None
    assert plan_detailed(state, EPOCH, Policy()).next_wakeup is None
