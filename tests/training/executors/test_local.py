"""The local executor with real processes: a small Python stand-in plays the trainer.

Every wait is for a real event (a line the child printed, an exit record on disk) with a
deadline; nothing sleeps and hopes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.training.executors.conftest import make_spec, wait_until
from training.executors import local_supervisor as sv
from training.executors.base import Handle, RunSpecMismatch, RunState
from training.executors.local import LocalConfig, LocalExecutor

REPO = Path(__file__).resolve().parents[3]

# The stand-in trainer. MODE=trap: SIGTERM -> "checkpoint" and exit 75 (the runner's
# contract); MODE=ignore: SIGTERM ignored; MODE=exit:N: exit N at once; MODE=grandchild:
# also start a grandchild in the same process group that ignores SIGTERM.
CHILD = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    mode = os.environ.get("MODE", "trap")
    if mode.startswith("exit:"):
        print("ready", flush=True)
        sys.exit(int(mode[5:]))
    def on_term(signum, frame):
        print("got SIGTERM, checkpointing", flush=True)
        sys.exit(75)
    signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "ignore" else on_term)
    if mode == "grandchild":
        g = subprocess.Popen([sys.executable, "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('grandchild', flush=True); time.sleep(600)"])
        print("grandchild-pid", g.pid, flush=True)
    for key in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "GPUBOOK_RUN_ID",
                "GPUBOOK_MUST_END_BY", "SCHEDULER_SECRET", "A_SETTING"):
        print(f"env {key}={os.environ.get(key, '<unset>')}", flush=True)
    print("cwd", os.getcwd(), flush=True)
    print("ready", os.getpid(), flush=True)
    if mode == "exit-after-ready":
        sys.exit(0)
    while True:
        signal.pause()
    """
)


def child_spec(run_id: int = 1, mode: str = "trap", **overrides):
    fields = {
        "run_id": run_id,
        "image": "local",
        "argv": [sys.executable, "-c", CHILD],
        "env": {"MODE": mode, "A_SETTING": "on"},
        "gpu_indices": (0, 2),
        "must_end_by": datetime.now(UTC) + timedelta(minutes=10),
        "grace_s": 30,
    }
    fields.update(overrides)
    return make_spec(**fields)


@pytest.fixture
def executor(tmp_path):
    ex = LocalExecutor(LocalConfig(state_dir=tmp_path / "state"))
    yield ex
    for observed in ex.observe():  # never leave a stand-in running
        if observed.state is RunState.RUNNING:
            ex.kill(observed.handle)
    for observed in ex.observe():
        wait_until(lambda h=observed.handle: _state(ex, h) is not RunState.RUNNING)


def _observed(ex: LocalExecutor, handle: Handle):
    return next(o for o in ex.observe() if o.run_id == handle.run_id)


def _state(ex: LocalExecutor, handle: Handle) -> RunState:
    return _observed(ex, handle).state


def wait_for_line(ex: LocalExecutor, handle: Handle, text: str) -> str:
    return wait_until(lambda: text in ex.log_tail(handle, 100) and ex.log_tail(handle, 100))


def wait_ended(ex: LocalExecutor, handle: Handle, timeout: float = 15.0):
    return wait_until(lambda: (o := _observed(ex, handle)).state is not RunState.RUNNING and o, timeout)


def test_child_gets_the_booked_gpus_and_a_clean_environment(executor, monkeypatch, tmp_path):
    monkeypatch.setenv("SCHEDULER_SECRET", "database-password")
    workdir = tmp_path / "work"
    workdir.mkdir()
    handle = executor.start(child_spec(workdir=str(workdir)))
    log = wait_for_line(executor, handle, "ready")
    assert "env CUDA_VISIBLE_DEVICES=0,2" in log
    assert "env CUDA_DEVICE_ORDER=PCI_BUS_ID" in log  # indices as nvidia-smi numbers them
    assert "env GPUBOOK_RUN_ID=1" in log
    assert "env A_SETTING=on" in log
    assert "env SCHEDULER_SECRET=<unset>" in log  # the scheduler's env does not leak
    assert f"cwd {workdir}" in log
    observed = _observed(executor, handle)
    assert (observed.state, observed.reason) == (RunState.RUNNING, "running")


def test_no_gpus_means_no_visible_gpus(executor):
    handle = executor.start(child_spec(gpu_indices=()))
    assert "env CUDA_VISIBLE_DEVICES=\n" in wait_for_line(executor, handle, "ready")


def test_child_runs_in_its_own_process_group(executor):
    handle = executor.start(child_spec())
    wait_for_line(executor, handle, "ready")
    run_dir = executor.state_dir / handle.name
    child = sv.read_json(run_dir / "child.json")
    supervisor = sv.read_json(run_dir / "supervisor.json")
    assert os.getpgid(child["pid"]) == child["pid"] == child["pgid"]
    assert os.getsid(supervisor["pid"]) == supervisor["pid"]  # a session of its own
    assert os.getpgid(child["pid"]) not in (os.getpgid(0), os.getpgid(supervisor["pid"]))


def test_stop_sends_sigterm_and_exit_75_is_checkpointed(executor):
    handle = executor.start(child_spec())
    wait_for_line(executor, handle, "ready")
    executor.stop(handle, grace_s=30)
    observed = wait_ended(executor, handle)
    assert (observed.state, observed.exit_code, observed.reason) == (RunState.CHECKPOINTED, 75, "stopped")
    assert "got SIGTERM, checkpointing" in executor.log_tail(handle)


def test_stop_escalates_to_sigkill_after_the_grace(executor):
    handle = executor.start(child_spec(mode="ignore"))
    wait_for_line(executor, handle, "ready")
    executor.stop(handle, grace_s=1)
    observed = wait_ended(executor, handle, timeout=10)
    assert (observed.state, observed.exit_code) == (RunState.FAILED, 128 + signal.SIGKILL)
    assert "grace expired" in executor.log_tail(handle)


def test_kill_ends_the_whole_group_now(executor):
    handle = executor.start(child_spec(mode="grandchild"))
    log = wait_for_line(executor, handle, "ready")
    grandchild = int(log.split("grandchild-pid ")[1].split()[0])
    executor.kill(handle)
    observed = wait_ended(executor, handle)
    assert (observed.state, observed.exit_code, observed.reason) == (RunState.FAILED, 128 + signal.SIGKILL, "killed")
    wait_until(lambda: sv.proc_stat(grandchild) is None or sv.proc_stat(grandchild)[0] == "Z")


def test_leftover_group_members_are_killed_when_the_run_ends(executor):
    handle = executor.start(child_spec(mode="grandchild"))
    log = wait_for_line(executor, handle, "ready")
    grandchild = int(log.split("grandchild-pid ")[1].split()[0])
    executor.stop(handle, grace_s=30)  # the child checkpoints; its grandchild ignores SIGTERM
    assert wait_ended(executor, handle).state is RunState.CHECKPOINTED
    wait_until(lambda: sv.proc_stat(grandchild) is None or sv.proc_stat(grandchild)[0] == "Z")


@pytest.mark.parametrize(
    ("mode", "state", "code"),
    [("exit:0", RunState.SUCCEEDED, 0), ("exit:75", RunState.CHECKPOINTED, 75), ("exit:3", RunState.FAILED, 3)],
)
def test_exit_codes_are_recorded(executor, mode, state, code):
    handle = executor.start(child_spec(mode=mode))
    observed = wait_ended(executor, handle)
    assert (observed.state, observed.exit_code, observed.reason) == (state, code, "exited")


def test_a_command_that_cannot_start_fails_with_127(executor, tmp_path):
    handle = executor.start(child_spec(argv=[str(tmp_path / "no-such-binary")]))
    observed = wait_ended(executor, handle)
    assert (observed.state, observed.exit_code, observed.reason) == (RunState.FAILED, 127, "spawn-failed")
    assert "No such file" in observed.detail


def test_start_is_idempotent(executor):
    spec = child_spec()
    first = executor.start(spec)
    wait_for_line(executor, first, "ready")
    pid = sv.read_json(executor.state_dir / first.name / "child.json")["pid"]
    assert executor.start(spec) == first
    assert LocalExecutor(executor.config).start(spec) == first  # after a restart, too
    assert sv.read_json(executor.state_dir / first.name / "child.json")["pid"] == pid
    executor.stop(first, grace_s=30)
    wait_ended(executor, first)
    assert executor.start(spec) == first  # an ended run is not started again
    assert executor.log_tail(first).count("ready") == 1
    assert _state(executor, first) is RunState.CHECKPOINTED


def test_same_run_id_with_another_spec_is_refused(executor):
    handle = executor.start(child_spec(mode="exit:0"))
    wait_ended(executor, handle)
    with pytest.raises(RunSpecMismatch):
        executor.start(child_spec(mode="exit:1"))


def test_a_run_whose_end_has_passed_is_not_started(executor):
    spec = child_spec()
    with pytest.raises(ValueError, match="has passed"):
        executor.start(spec, now=spec.must_end_by)
    assert executor.observe() == []


def test_the_supervisor_ends_the_run_at_must_end_by(executor):
    # The scheduler never calls stop: the backstop alone sends SIGTERM at must_end_by.
    spec = child_spec(must_end_by=datetime.now(UTC) + timedelta(seconds=2), grace_s=5)
    handle = executor.start(spec)
    wait_for_line(executor, handle, "ready")
    observed = wait_ended(executor, handle)
    assert (observed.state, observed.exit_code, observed.reason) == (RunState.CHECKPOINTED, 75, "deadline")
    ended_at = datetime.fromisoformat(sv.read_json(executor.state_dir / handle.name / "exit.json")["ended_at"])
    assert ended_at >= spec.must_end_by


def test_a_restarted_scheduler_adopts_running_runs(tmp_path):
    """Start from another process that then exits (the old scheduler), then observe and
    stop through a new executor that never forked the run."""
    state_dir = tmp_path / "state"
    spec = child_spec(run_id=5)
    script = textwrap.dedent(
        f"""
        import sys
        from datetime import datetime
        from training.executors.base import RunSpec
        from training.executors.local import LocalConfig, LocalExecutor
        spec = RunSpec(run_id=5, image="local", argv={list(spec.argv)!r}, node_name="n",
                       gpu_indices=(0, 2), team="vision", job_id=7,
                       must_end_by=datetime.fromisoformat({spec.must_end_by.isoformat()!r}),
                       grace_s=30, env={dict(spec.env)!r})
        LocalExecutor(LocalConfig(state_dir={str(state_dir)!r})).start(spec)
        """
    )
    subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, check=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    adopted = LocalExecutor(LocalConfig(state_dir=state_dir))
    try:
        observed = wait_until(lambda: adopted.observe())
        handle = observed[0].handle
        assert (observed[0].run_id, observed[0].state) == (5, RunState.RUNNING)
        wait_for_line(adopted, handle, "ready")
        adopted.stop(handle, grace_s=30)
        ended = wait_ended(adopted, handle)
        assert (ended.state, ended.exit_code) == (RunState.CHECKPOINTED, 75)
    finally:
        for o in adopted.observe():
            adopted.kill(o.handle)


def test_a_recycled_pid_is_never_signalled(tmp_path):
    """The records name a live process whose start time differs: it is someone else."""
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        real = sv.proc_stat(victim.pid)
        assert real is not None and sv.process_alive(victim.pid, real[1])  # positive control
        state_dir = tmp_path / "state"
        run_dir = state_dir / "gpubook-run-9"
        run_dir.mkdir(parents=True)
        spec = child_spec(run_id=9)
        sv.write_json_atomic(
            run_dir / "run.json",
            {"spec": spec.as_json(), "spec_hash": spec.spec_hash(), "log_path": str(tmp_path / "9.log")},
        )
        stale = {"pid": victim.pid, "pgid": victim.pid, "start_ticks": real[1] - 1}
        sv.write_json_atomic(run_dir / "supervisor.json", stale)
        sv.write_json_atomic(run_dir / "child.json", stale)
        executor = LocalExecutor(LocalConfig(state_dir=state_dir))
        [observed] = executor.observe()
        assert (observed.state, observed.reason) == (RunState.GONE, "lost")
        executor.stop(observed.handle, grace_s=0)
        executor.kill(observed.handle)
        assert victim.poll() is None  # still alive: neither SIGTERM nor SIGKILL reached it
        assert executor.start(spec) == observed.handle  # not relaunched either
    finally:
        victim.kill()
        victim.wait()


def test_cleanup_forgets_the_run_and_keeps_its_log(executor):
    handle = executor.start(child_spec(mode="exit:0"))
    wait_ended(executor, handle)
    log_path = Path(sv.read_json(executor.state_dir / handle.name / "run.json")["log_path"])
    executor.cleanup(handle)
    assert executor.observe() == []
    assert "ready" in log_path.read_text()
    executor.cleanup(handle)  # idempotent


def test_cleanup_of_a_running_run_kills_it(executor):
    handle = executor.start(child_spec(mode="ignore"))
    log = wait_for_line(executor, handle, "ready")
    pid = int(log.split("ready ")[1].split()[0])
    executor.cleanup(handle)
    wait_until(lambda: sv.proc_stat(pid) is None or sv.proc_stat(pid)[0] == "Z")


def test_log_tail_returns_the_last_lines(executor, tmp_path):
    log_path = tmp_path / "custom" / "run.log"
    handle = executor.start(child_spec(mode="exit:0", log_path=str(log_path)))
    wait_ended(executor, handle)
    assert executor.log_tail(handle, 1).startswith("[gpubook supervisor]")
    assert executor.log_tail(handle, 0) == ""
    assert log_path.read_text().endswith(executor.log_tail(handle, 2))
    assert executor.log_tail(Handle(run_id=99, name="gpubook-run-99", executor="local")) == ""


def test_state_files_are_plain_json(executor):
    handle = executor.start(child_spec(mode="exit:0"))
    wait_ended(executor, handle)
    record = json.loads((executor.state_dir / handle.name / "exit.json").read_text())
    assert record["exit_code"] == 0
    assert {"started_at", "ended_at", "reason", "signal"} <= record.keys()


def test_a_relative_state_dir_works_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    executor = LocalExecutor(LocalConfig(state_dir=Path("state")))
    handle = executor.start(child_spec(mode="exit:0", log_path="logs/run.log"))
    assert wait_ended(executor, handle).state is RunState.SUCCEEDED
    assert "ready" in (tmp_path / "logs" / "run.log").read_text()
