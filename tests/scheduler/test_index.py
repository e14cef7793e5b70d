"""The caller-owned `IndexCache`: what it hands back equals a fresh build, however the
reservations, runs and time moved between plans."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.index import IndexCache, ReservationIndex, runs_view_of
from scheduler.snapshot import ReservationStatus
from tests.scheduler.builders import reservation, run

_reservations = st.lists(
    st.builds(
        lambda number, gpu, start, length, jobless, cancelled: reservation(
            number, (gpu, gpu + 1), float(start), float(start + length),
            job_id=None if jobless else number,
            status=ReservationStatus.CANCELLED if cancelled else ReservationStatus.CONFIRMED,
        ),
        st.integers(0, 10_000), st.integers(0, 6), st.integers(0, 100), st.integers(1, 60),
        st.booleans(), st.booleans(),
    ),
    max_size=12,
    unique_by=lambda item: item.id,
)


@settings(max_examples=200, deadline=None)
@given(_reservations, st.lists(st.tuples(st.integers(0, 3), st.integers(0, 30)), max_size=10))
def test_cached_index_equals_a_fresh_build(reservations, steps):
    """Steps: 0 keeps the tuple, 1 appends the next booking (the extended index), 2 drops
    the first, 3 rebuilds the same contents as a new tuple; time moves forward by the
    second number."""
    cache = IndexCache()
    shown = tuple(reservations[:3])
    waiting = list(reservations[3:])
    now = 0.0
    for step, elapsed in steps:
        now += elapsed
        if step == 1 and waiting:
            shown = (*shown, waiting.pop(0))
        elif step == 2 and shown:
            shown = shown[1:]
        elif step == 3:
            shown = tuple(list(shown))
        cached = cache.reservation_index(shown, now)
        fresh = ReservationIndex.build(shown, now)
        assert cached == fresh
        # Dictionary order too, so that no consumer can see a difference.
        assert list(cached.by_id) == list(fresh.by_id)
        assert list(cached.next_start_on_gpu) == list(fresh.next_start_on_gpu)


def test_runs_view_keeps_the_lowest_run_id_per_gpu_and_reservation():
    later = run(7, gpu_ids=(1, 2), job_id=70, reservation_id=5)
    earlier = run(3, gpu_ids=(2, 3), job_id=30, reservation_id=5)
    view = runs_view_of((later, earlier))
    assert [item.id for item in view.runs] == [3, 7]
    assert view.occupied == {2: 3, 3: 3, 1: 7}
    assert view.runs_by_reservation == {5: earlier}
    assert view.running_jobs == {30, 70}
