"""RunSpec validation, names, and the meaning of exit codes."""

from datetime import UTC, datetime, timedelta, timezone

import pytest

from tests.training.executors.conftest import NOW, make_spec
from training.executors.base import (
    Executor,
    Handle,
    RunState,
    run_id_from_name,
    run_name,
    state_for_exit_code,
)
from training.executors.kubernetes import KubernetesConfig, KubernetesExecutor
from training.executors.local import LocalConfig, LocalExecutor
from training.runner.exitcodes import EXIT_CHECKPOINTED, EXIT_FAILED, EXIT_SUCCEEDED


def test_run_name_is_deterministic_and_reversible():
    assert run_name(42) == "gpubook-run-42"
    assert run_id_from_name("gpubook-run-42") == 42
    assert run_id_from_name("gpubook-run-042") is None
    assert run_id_from_name("other-42") is None
    for bad in (0, -1, True, "42"):
        with pytest.raises(ValueError):
            run_name(bad)


def test_exit_codes_map_to_states():
    assert state_for_exit_code(EXIT_SUCCEEDED) is RunState.SUCCEEDED
    assert state_for_exit_code(EXIT_CHECKPOINTED) is RunState.CHECKPOINTED
    assert state_for_exit_code(EXIT_FAILED) is RunState.FAILED
    assert state_for_exit_code(137) is RunState.FAILED
    assert state_for_exit_code(143) is RunState.FAILED


def test_spec_normalises_lists_and_time_zone():
    cest = timezone(timedelta(hours=2))
    spec = make_spec(argv=["a", "b"], gpu_indices=[3, 1], must_end_by=datetime(2026, 5, 4, 13, tzinfo=cest))
    assert spec.argv == ("a", "b")
    assert spec.gpu_indices == (3, 1)
    assert spec.gpu_count == 2
    assert spec.must_end_by == datetime(2026, 5, 4, 11, tzinfo=UTC)
    assert spec.must_end_by.tzinfo is UTC


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"argv": "python train.py"}, "never a shell string"),
        ({"argv": []}, "non-empty"),
        ({"argv": ["python", 3]}, "non-empty list of strings"),
        ({"gpu_indices": (0, 0)}, "must not repeat"),
        ({"gpu_indices": (-1,)}, "non-negative"),
        ({"gpu_indices": (0, 1), "gpu_count": 3}, "does not match"),
        ({"must_end_by": datetime(2026, 5, 4, 11)}, "timezone-aware"),
        ({"grace_s": -5}, "grace_s"),
        ({"image": "yolo v8"}, "bad image"),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}}, "set by the executor"),
        ({"env": {"NVIDIA_VISIBLE_DEVICES": "all"}}, "set by the executor"),
        ({"env": {"GPUBOOK_RUN_ID": "1"}}, "set by the executor"),
        ({"env": {"BAD-NAME": "x"}}, "bad environment variable name"),
        ({"env": {"N": 1}}, "must be a string"),
        ({"team": ""}, "team"),
    ],
)
def test_spec_rejects(overrides, message):
    with pytest.raises(ValueError, match=message):
        make_spec(**overrides)


def test_spec_hash_identifies_the_spec():
    assert make_spec().spec_hash() == make_spec().spec_hash()
    assert make_spec().spec_hash() != make_spec(argv=["python", "other.py"]).spec_hash()
    assert make_spec().spec_hash() != make_spec(must_end_by=NOW + timedelta(hours=3)).spec_hash()


def test_runner_env_carries_the_contract():
    env = make_spec(output_dir="/runs/vision/7").runner_env()
    assert env == {
        "GPUBOOK_RUN_ID": "42",
        "GPUBOOK_JOB_ID": "7",
        "GPUBOOK_MUST_END_BY": "2026-05-04T11:00:00+00:00",
        "GPUBOOK_GRACE_S": "120",
        "GPUBOOK_OUTPUT_DIR": "/runs/vision/7",
    }


def test_handle_round_trips_through_a_dict():
    handle = Handle(run_id=3, name="gpubook-run-3", executor="kubernetes", namespace="ns", uid="u")
    assert Handle.from_dict(handle.as_dict()) == handle


def test_both_executors_satisfy_the_protocol(tmp_path):
    assert isinstance(LocalExecutor(LocalConfig(state_dir=tmp_path)), Executor)
    assert isinstance(KubernetesExecutor(KubernetesConfig(image_allowlist=())), Executor)
