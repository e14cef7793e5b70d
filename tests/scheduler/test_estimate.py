"""Runtime estimate (Tsafrir): mean of the user's last two runs of similar size."""

from __future__ import annotations

import pytest

from scheduler import PastRun, estimate_duration_s, estimate_from_recent, size_class
from scheduler.estimate import grown_estimate

DEFAULT_S = 3600.0


@pytest.mark.parametrize(
    ("gpus", "bucket"), [(1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (8, 3), (9, 4), (16, 4)]
)
def test_size_classes_are_powers_of_two(gpus, bucket):
    assert size_class(gpus) == bucket


def test_size_class_rejects_zero():
    with pytest.raises(ValueError, match="at least 1"):
        size_class(0)


HISTORY = (
    PastRun(user="alice", gpus=1, duration_s=100.0, ended_at=10.0, job_id=1),
    PastRun(user="alice", gpus=1, duration_s=300.0, ended_at=20.0, job_id=2),
    PastRun(user="alice", gpus=1, duration_s=500.0, ended_at=30.0, job_id=3),
    PastRun(user="alice", gpus=8, duration_s=9000.0, ended_at=40.0, job_id=4),
    PastRun(user="bob", gpus=1, duration_s=50.0, ended_at=50.0, job_id=5),
)


@pytest.mark.parametrize(
    ("user", "gpus", "expected"),
    [
        ("alice", 1, 400.0),  # mean of the last two 1-GPU runs (300, 500)
        ("alice", 8, 9000.0),  # only one run of that size: itself
        ("alice", 2, DEFAULT_S),  # nothing of similar size
        ("bob", 1, 50.0),
        ("carol", 1, DEFAULT_S),
    ],
)
def test_estimate(user, gpus, expected):
    assert estimate_duration_s(HISTORY, user=user, gpus=gpus, default_s=DEFAULT_S) == expected


def test_estimate_does_not_depend_on_history_order():
    shuffled = tuple(reversed(HISTORY))
    assert estimate_duration_s(shuffled, user="alice", gpus=1, default_s=DEFAULT_S) == 400.0


def test_estimate_from_recent_uses_the_last_two():
    assert estimate_from_recent([10.0, 20.0, 40.0], DEFAULT_S) == 30.0
    assert estimate_from_recent([], DEFAULT_S) == DEFAULT_S


@pytest.mark.parametrize(
    ("estimate", "ran", "expected"),
    [(600.0, 100.0, 600.0), (600.0, 600.0, 1200.0), (None, 4000.0, 8000.0), (None, 10.0, DEFAULT_S)],
)
def test_estimate_grows_when_a_run_outlives_it(estimate, ran, expected):
    assert grown_estimate(estimate, ran, DEFAULT_S) == expected


def test_predict_runtime_prefers_similar_jobs_then_size_then_user_then_default():
    from scheduler import RuntimeSource, predict_runtime

    history = (
        *HISTORY,
        PastRun(user="alice", gpus=1, duration_s=7000.0, ended_at=60.0, job_id=7,
                similar=("yolo:v8", "coco", 50, 640)),
    )
    signature = ("yolo:v8", "coco", 50, 640)
    similar = predict_runtime(history, user="alice", gpus=1, default_s=DEFAULT_S,
                              similar=signature, user_estimate_s=10.0)
    assert (similar.seconds, similar.source) == (7000.0, RuntimeSource.HISTORY)
    by_size = predict_runtime(history, user="alice", gpus=1, default_s=DEFAULT_S,
                              similar=("other",), user_estimate_s=10.0)
    # Last two 1-GPU runs of alice: job 3 (500 s) and job 7 (7000 s).
    assert (by_size.seconds, by_size.source) == (3750.0, RuntimeSource.HISTORY)
    stranger = predict_runtime(history, user="dave", gpus=1, default_s=DEFAULT_S,
                               user_estimate_s=1234.0)
    assert (stranger.seconds, stranger.source) == (1234.0, RuntimeSource.USER)
    nothing = predict_runtime(history, user="dave", gpus=1, default_s=DEFAULT_S)
    assert (nothing.seconds, nothing.source) == (DEFAULT_S, RuntimeSource.DEFAULT)
    # The history's order does not matter.
    assert predict_runtime(history[::-1], user="alice", gpus=1, default_s=DEFAULT_S) == by_size
