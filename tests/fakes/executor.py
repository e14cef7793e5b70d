"""An in-memory executor that records every call, for testing reconcile's decisions tick by
tick without processes (STYLE.md habit 18). The real executors keep their own tests.

It speaks the `Executor` protocol: `start` returns a handle (with a namespace, like the
Kubernetes executor, so a test can see the stored handle come back), `stop`/`kill` record
the request, `observe` reports each run's state. The test plays the run itself:
`finish`, `fail`, and `checkpoint` (which writes the runner's termination message into the
run's output dir, as the runner does, then exits 75). A stopped run stays running until the
test ends it — the executor never decides for the run; a killed run ends at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from training.executors.base import Handle, ObservedRun, RunSpec, RunSpecMismatch, RunState, run_name
from training.runner.exitcodes import EXIT_CHECKPOINTED, EXIT_FAILED, EXIT_SUCCEEDED
from training.runner.termination import termination_message, write_termination


@dataclasses.dataclass
class Call:
    method: str  # start | stop | kill | cleanup
    run_id: int
    handle: Handle | None = None
    grace_s: int | None = None
    spec: RunSpec | None = None
    now: datetime | None = None


@dataclasses.dataclass
class FakeRun:
    spec: RunSpec
    handle: Handle
    state: RunState = RunState.RUNNING
    exit_code: int | None = None
    reason: str = "running"


class FakeExecutor:
    kind = "fake"

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.runs: dict[int, FakeRun] = {}

    # -- the Executor protocol ----------------------------------------------------------------
    def start(self, spec: RunSpec, *, now: datetime | None = None) -> Handle:
        self.calls.append(Call("start", spec.run_id, spec=spec, now=now))
        existing = self.runs.get(spec.run_id)
        if existing is not None:
            if existing.spec.spec_hash() != spec.spec_hash():
                raise RunSpecMismatch(f"{spec.name} exists with another spec")
            return existing.handle
        handle = Handle(run_id=spec.run_id, name=run_name(spec.run_id), executor=self.kind,
                        namespace=f"fake-{spec.team}", uid=f"uid-{spec.run_id}")
        self.runs[spec.run_id] = FakeRun(spec=spec, handle=handle)
        return handle

    def stop(self, handle: Handle, grace_s: int) -> None:
        self.calls.append(Call("stop", handle.run_id, handle=handle, grace_s=grace_s))

    def kill(self, handle: Handle) -> None:
        self.calls.append(Call("kill", handle.run_id, handle=handle))
        run = self.runs.get(handle.run_id)
        if run is not None and not run.state.ended:
            run.state, run.exit_code, run.reason = RunState.FAILED, -9, "killed"

    def observe(self, *, teams: Iterable[str] = ()) -> list[ObservedRun]:
        return [
            ObservedRun(run_id=run_id, state=run.state, handle=run.handle, exit_code=run.exit_code, reason=run.reason)
            for run_id, run in sorted(self.runs.items())
        ]

    def cleanup(self, handle: Handle) -> None:
        self.calls.append(Call("cleanup", handle.run_id, handle=handle))
        self.runs.pop(handle.run_id, None)

    def log_tail(self, handle: Handle, lines: int = 200) -> str:
        return ""

    # -- the run's side, played by the test ---------------------------------------------------
    def finish(self, run_id: int) -> None:
        self._end(run_id, RunState.SUCCEEDED, EXIT_SUCCEEDED, status="succeeded", reason="done")

    def fail(self, run_id: int, reason: str = "boom") -> None:
        self._end(run_id, RunState.FAILED, EXIT_FAILED, status="failed", reason=reason)

    def checkpoint(
        self, run_id: int, *, epoch: int = 1, epochs: int = 10, write_file: bool = True, died_of: int | None = None
    ) -> Path:
        """The run saves a checkpoint (`last.pt`, unless `write_file` is false) and exits 75, as
        the runner does on SIGTERM; `died_of`: it wrote all that, then died of this signal."""
        run = self.runs[run_id]
        path = Path(run.spec.output_dir or "/nonexistent") / "train" / "weights" / "last.pt"
        if write_file:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"checkpoint of run %d" % run_id)
        self._end(run_id, RunState.CHECKPOINTED, EXIT_CHECKPOINTED, status="checkpointed", reason="signal SIGTERM",
                  checkpoint=path, epoch=epoch, epochs=epochs)
        if died_of is not None:
            run.state, run.exit_code = RunState.FAILED, 128 + died_of
        return path

    def set_reason(self, run_id: int, reason: str) -> None:
        """What the executor says about a running run (e.g. "supervisor-lost")."""
        self.runs[run_id].reason = reason

    def _end(self, run_id: int, state: RunState, exit_code: int, **message: Any) -> None:
        run = self.runs[run_id]
        run.state, run.exit_code, run.reason = state, exit_code, "exited"
        if run.spec.output_dir:
            message.setdefault("checkpoint", None)
            write_termination(termination_message(run_id=str(run_id), exit_code=exit_code, **message),
                              Path(run.spec.output_dir))

    # -- for assertions -----------------------------------------------------------------------
    def calls_of(self, method: str, run_id: int | None = None) -> list[Call]:
        return [call for call in self.calls if call.method == method and (run_id is None or call.run_id == run_id)]

    def started(self) -> list[int]:
        return [call.run_id for call in self.calls_of("start")]
