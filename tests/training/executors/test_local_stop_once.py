"""The local supervisor forwards the first SIGTERM only: repeated stops (a re-delivery, a
person) reach the supervisor, never the run again. Real processes; a stand-in counts the
SIGTERMs it receives and exits 75 after a "checkpoint" longer than the repeats take."""

from __future__ import annotations

import sys
import textwrap
from datetime import UTC, datetime, timedelta

import pytest

from tests.training.executors.conftest import make_spec, wait_until
from training.executors.base import RunState
from training.executors.local import LocalConfig, LocalExecutor

COUNTER = textwrap.dedent(
    """
    import signal, sys, time
    got = []
    signal.signal(signal.SIGTERM, lambda *a: got.append(time.monotonic()))
    print("ready", flush=True)
    while not got:
        time.sleep(0.01)
    time.sleep(1.5)  # saving a checkpoint
    print(f"sigterms received: {len(got)}", flush=True)
    sys.exit(75)
    """
)


@pytest.fixture
def executor(tmp_path):
    ex = LocalExecutor(LocalConfig(state_dir=tmp_path / "state"))
    yield ex
    for observed in ex.observe():
        if observed.state is RunState.RUNNING:
            ex.kill(observed.handle)


def test_supervisor_forwards_the_first_sigterm_only(executor):
    spec = make_spec(run_id=5, image="local", argv=[sys.executable, "-c", COUNTER], gpu_indices=(0,),
                     must_end_by=datetime.now(UTC) + timedelta(minutes=10), grace_s=30)
    handle = executor.start(spec)
    wait_until(lambda: "ready" in executor.log_tail(handle))
    for _ in range(4):
        executor.stop(handle, 30)
    wait_until(lambda: "SIGTERM not forwarded again" in executor.log_tail(handle))
    observed = wait_until(
        lambda: next((o for o in executor.observe() if o.run_id == 5 and o.state.ended), None), timeout=20
    )
    log = executor.log_tail(handle, 100)
    assert observed.state is RunState.CHECKPOINTED and observed.exit_code == 75, log
    assert "sigterms received: 1" in log
    assert log.count("SIGTERM to the run's process group") == 1
