"""Concurrent bookings on PostgreSQL: the guards hold, and without them the race is real.

Each negative control removes a guard and puts a barrier inside the service's read step, so
every thread has read "free" / "under quota" before any thread writes: the interleaving that
real load produces only sometimes is forced every time.
"""

import contextlib
import datetime as dt
import importlib
import threading

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, connections

from config.errors import Conflict
from gpus.models import Gpu, Node
from reservations import selectors, services
from reservations.models import Membership, Reservation, ReservationGpu, Team

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

no_overlap_migration = importlib.import_module("reservations.migrations.0002_no_overlap_constraint")
THREADS = 16
START = dt.datetime(2031, 3, 3, 9, tzinfo=dt.UTC)
NOW = dt.datetime(2031, 3, 1, tzinfo=dt.UTC)
H = dt.timedelta(hours=1)


@pytest.fixture
def racers(postgres_only, settings):
    """One user per thread, each in a team of their own, so only the per-GPU locks and the
    constraint stand between them (not the shared team row lock). Sixteen racers queue on
    one lock on a busy CI machine: the lock timeout is lifted so that what these tests see is
    the locks' ordering, not "busy" (tests/reservations/test_booking_locks.py covers that)."""
    settings.GPUBOOK_BOOKING_LOCK_TIMEOUT_MS = 60_000
    node = Node.objects.create(name="race-node")
    gpus = [Gpu.objects.create(node=node, index=i, model_name="A100", memory_mib=81920) for i in range(THREADS)]
    users, teams = [], []
    for number in range(THREADS):
        team = Team.objects.create(name=f"team{number}", slug=f"team{number}", monthly_gpu_hours=1000)
        user = get_user_model().objects.create_user(username=f"racer{number}")
        Membership.objects.create(team=team, user=user)
        users.append(user)
        teams.append(team)
    return {"gpus": gpus, "users": users, "teams": teams}


def race(attempts) -> list[object]:
    """Run the callables at once from a barrier; return each one's result or exception."""
    results: list[object] = [None] * len(attempts)
    start_line = threading.Barrier(len(attempts))

    def run(position: int) -> None:
        try:
            start_line.wait(timeout=10)
            results[position] = attempts[position]()
        except Exception as error:  # each outcome is inspected by the test
            results[position] = error
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(attempts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    return results


def pause_after(monkeypatch, module, name: str, parties: int, timeout: float) -> None:
    """Make `module.name` wait for all racers after doing its read."""
    original = getattr(module, name)
    barrier = threading.Barrier(parties)

    def wrapped(*args, **kwargs):
        result = original(*args, **kwargs)
        # A broken barrier means a guard serializes the racers: nobody else can get here now.
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=timeout)
        return result

    monkeypatch.setattr(module, name, wrapped)


@pytest.fixture
def without_constraint():
    with connection.schema_editor() as editor:
        no_overlap_migration.drop(None, editor)
    yield
    Reservation.objects.all().delete()
    with connection.schema_editor() as editor:
        no_overlap_migration.create(None, editor)


def same_slot_attempts(racers):
    gpu = racers["gpus"][0]
    return [
        (lambda user=user, team=team: services.reservation_create(
            user=user, team=team, gpu_ids=[gpu.pk], start=START, end=START + H, now=NOW))
        for user, team in zip(racers["users"], racers["teams"], strict=True)
    ]


def overlapping_pairs() -> int:
    rows = list(ReservationGpu.objects.filter(occupies=True).values_list("gpu_id", "start", "end"))
    return sum(
        1 for i, a in enumerate(rows) for b in rows[i + 1:] if a[0] == b[0] and a[1] < b[2] and b[1] < a[2]
    )


def outcome(results) -> tuple[int, set[str]]:
    booked = sum(isinstance(result, Reservation) for result in results)
    codes = {result.code for result in results if isinstance(result, Conflict)}
    unexpected = [result for result in results if isinstance(result, Exception) and not isinstance(result, Conflict)]
    assert not unexpected, unexpected
    return booked, codes


def test_same_slot_exactly_one_wins(racers):
    booked, codes = outcome(race(same_slot_attempts(racers)))
    assert booked == 1 and codes == {"slot_conflict"}
    assert overlapping_pairs() == 0


def test_negative_control_without_any_guard_double_books(racers, monkeypatch, without_constraint):
    monkeypatch.setattr(services, "_lock_booking", lambda **kwargs: None)
    pause_after(monkeypatch, selectors, "booking_reads", THREADS, timeout=10)
    booked, _ = outcome(race(same_slot_attempts(racers)))
    assert booked > 1, "without locks and constraint every racer should have got the slot"
    assert overlapping_pairs() > 0


def test_constraint_alone_holds(racers, monkeypatch):
    # Sixteen writers past the check at once meet in the constraint's waits, where PostgreSQL
    # may pick deadlock victims again and again; a loser then hears "busy" instead of
    # "taken". Either way exactly one books; how a refusal reads is the test below.
    monkeypatch.setattr(services, "_lock_booking", lambda **kwargs: None)
    pause_after(monkeypatch, selectors, "booking_reads", THREADS, timeout=10)
    booked, codes = outcome(race(same_slot_attempts(racers)))
    assert booked == 1 and codes <= {"slot_conflict", "busy"}
    assert overlapping_pairs() == 0


def test_a_booking_the_constraint_refuses_reads_as_a_conflict(racers, monkeypatch):
    """The interleaving the race makes only sometimes, made every time: without the locks,
    another booking of the slot commits between this booking's check and its write."""
    monkeypatch.setattr(services, "_lock_booking", lambda **kwargs: None)
    first, second = same_slot_attempts(racers)[:2]
    original = selectors.booking_reads
    winner: list[object] = []

    def read_then_lose_the_slot(*args, **kwargs):
        reads = original(*args, **kwargs)
        if not winner:  # once: the other booking runs (and commits) on its own connection
            winner.append(None)  # taken before it runs: its own read passes straight through
            winner[0] = race([second])[0]
        return reads

    monkeypatch.setattr(selectors, "booking_reads", read_then_lose_the_slot)
    with pytest.raises(Conflict) as refused:
        first()
    assert isinstance(winner[0], Reservation)
    assert refused.value.code == "slot_conflict"
    assert overlapping_pairs() == 0


def test_locks_alone_hold(racers, monkeypatch, without_constraint):
    pause_after(monkeypatch, selectors, "booking_reads", THREADS, timeout=0.5)
    booked, codes = outcome(race(same_slot_attempts(racers)))
    assert booked == 1 and codes == {"slot_conflict"}
    assert overlapping_pairs() == 0


def quota_attempts(racers, team):
    return [
        (lambda gpu=gpu: services.reservation_create(
            user=racers["users"][0], team=team, gpu_ids=[gpu.pk], start=START, end=START + H, now=NOW))
        for gpu in racers["gpus"]
    ]


def test_concurrent_bookings_never_overspend_quota(racers):
    team = racers["teams"][0]
    Team.objects.filter(pk=team.pk).update(monthly_gpu_hours=10)
    booked, codes = outcome(race(quota_attempts(racers, team)))
    assert booked == 10 and codes == {"quota_exceeded"}
    assert selectors.team_quota_position(team=team, now=START).used_gpu_hours == 10.0


def test_negative_control_quota_overspends_without_the_lock(racers, monkeypatch):
    team = racers["teams"][0]
    Team.objects.filter(pk=team.pk).update(monthly_gpu_hours=10)
    monkeypatch.setattr(services, "_lock_booking", lambda **kwargs: None)
    pause_after(monkeypatch, selectors, "booking_reads", THREADS, timeout=10)
    booked, _ = outcome(race(quota_attempts(racers, team)))
    assert booked > 10
    assert selectors.quota_positions(teams=[team], now=START)[team.pk].used_gpu_hours > 10  # not the paused one
