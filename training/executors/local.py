"""Local executor: one supervised child process per run on this machine.

Each run gets a directory `<state_dir>/gpubook-run-<id>/`. `start` writes `run.json` (the
spec and its hash) and launches `local_supervisor.py` in a new session; the supervisor
starts the argv in a process group of its own with `CUDA_VISIBLE_DEVICES` set to the booked
GPU indices, waits for it and records its exit code (see local_supervisor.py for why a
supervisor is needed, and for the files it writes). Output goes to
`<state_dir>/logs/gpubook-run-<id>.log` unless the spec names a log path.

Everything the executor knows is on disk, so a new instance (a restarted scheduler) sees
the same runs. Processes are recognised by pid *and* /proc start time, so a recycled pid is
never signalled. Runs survive the scheduler only if the service manager lets them: under
systemd use `KillMode=process` (the default `control-group` kills supervisors too).

The child's environment is built from scratch: a few inherited variables (`inherit_env`),
the spec's env and the runner contract (GPUBOOK_*), so the scheduler's secrets never reach
a training job.

Isolation (docs/security.md): a job running as the server's own OS user could still read the
server's secrets from /proc/<pid>/environ and its database file. With `job_user` set
(GPUBOOK_JOB_USER) the job runs as that unprivileged user (through `setpriv` when the
scheduler is root, else `sudo -n -u`), in its own output directory, and the executor's state
directory is closed to it. Without one, `refuse_commands` turns away arbitrary command jobs
(the trainer itself still runs) unless the workstation declared one trusted user.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from training.executors import local_supervisor as sv
from training.executors.base import (
    Handle,
    ObservedRun,
    RunSpec,
    RunSpecMismatch,
    RunState,
    run_id_from_name,
    run_name,
    state_for_exit_code,
)

SUPERVISOR_SCRIPT = Path(sv.__file__).resolve()

DEFAULT_INHERIT_ENV = (
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "VIRTUAL_ENV",
)


@dataclass(frozen=True)
class LocalConfig:
    state_dir: Path
    python: str = sys.executable  # runs the supervisor (stdlib only, `-I`)
    inherit_env: tuple[str, ...] = DEFAULT_INHERIT_ENV
    start_timeout_s: float = 10.0  # how long start() waits for the supervisor to report in
    job_user: str = ""  # run jobs as this unprivileged OS user ("" = as the server's user)
    refuse_commands: bool = False  # without job_user: refuse argv that is not the trainer


class CommandJobsRefused(ValueError):
    """A command job on a local executor that would run it as the server's own user."""


RUNNER_MODULE = "training.runner"


def is_runner_argv(argv: tuple[str, ...]) -> bool:
    """The trainer (`python -m training.runner --spec …`), as training.launch builds it."""
    return len(argv) >= 3 and argv[1:3] == ("-m", RUNNER_MODULE)


def _job_identity(name: str) -> tuple[int, int, str]:
    import pwd

    entry = pwd.getpwnam(name)  # KeyError: the configured user does not exist
    if entry.pw_uid == 0:
        raise ValueError(f"GPUBOOK_JOB_USER {name!r} is root; jobs need an unprivileged user")
    return entry.pw_uid, entry.pw_gid, entry.pw_dir


class LocalExecutor:
    kind = "local"

    def __init__(self, config: LocalConfig) -> None:
        self.config = config
        self.state_dir = Path(config.state_dir).resolve()  # the supervisor runs elsewhere
        self.log_dir = self.state_dir / "logs"
        # Supervisors this instance forked: polled so they do not linger as zombies.
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    # -- paths and records --------------------------------------------------------------
    def _run_dir(self, run_id: int) -> Path:
        return self.state_dir / run_name(run_id)

    def _handle(self, run_id: int) -> Handle:
        return Handle(run_id=run_id, name=run_name(run_id), executor=self.kind)

    def _log_path(self, spec: RunSpec) -> Path:
        return Path(spec.log_path).resolve() if spec.log_path else self.log_dir / f"{spec.name}.log"

    @contextlib.contextmanager
    def _start_lock(self) -> Iterator[None]:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.state_dir / ".start.lock", "a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _reap(self) -> None:
        for run_id, proc in list(self._children.items()):
            if proc.poll() is not None:
                del self._children[run_id]

    @staticmethod
    def _alive(record: dict[str, Any] | None) -> bool:
        return bool(record) and sv.process_alive(record.get("pid"), record.get("start_ticks"))

    # -- the interface --------------------------------------------------------------------
    def start(self, spec: RunSpec, *, now: datetime | None = None) -> Handle:
        now = now or datetime.now(UTC)
        if self.config.refuse_commands and not self.config.job_user and not is_runner_argv(tuple(spec.argv)):
            raise CommandJobsRefused(
                "command jobs are refused on this server: the local executor would run them as the server's own "
                "user; set GPUBOOK_JOB_USER (an unprivileged user, see the README) or GPUBOOK_SINGLE_USER=true"
            )
        run_dir = self._run_dir(spec.run_id)
        with self._start_lock():
            existing = sv.read_json(run_dir / "run.json")
            if existing is not None:
                if existing.get("spec_hash") != spec.spec_hash():
                    raise RunSpecMismatch(f"{spec.name} exists in {run_dir} with a different spec")
                if not self._needs_launch(run_dir):
                    return self._handle(spec.run_id)
                if spec.must_end_by <= now:
                    raise ValueError(f"{spec.name}: must_end_by {spec.must_end_by} has passed")
            elif spec.must_end_by <= now:
                raise ValueError(f"{spec.name}: must_end_by {spec.must_end_by} has passed")
            else:
                run_dir.mkdir(parents=True, exist_ok=True)
                sv.write_json_atomic(
                    run_dir / "run.json",
                    {
                        "spec": spec.as_json(),
                        "spec_hash": spec.spec_hash(),
                        "log_path": str(self._log_path(spec)),
                        "created_at": now.isoformat(),
                    },
                )
            self._launch(spec, run_dir)
        return self._handle(spec.run_id)

    def _needs_launch(self, run_dir: Path) -> bool:
        """Only a run whose supervisor never reported in (a crash inside start) is launched
        again; the supervisor's lock makes a racing duplicate exit without starting."""
        return not any((run_dir / f).exists() for f in ("supervisor.json", "child.json", "exit.json"))

    def _child_env(self, spec: RunSpec) -> dict[str, str]:
        env = {k: os.environ[k] for k in self.config.inherit_env if k in os.environ}
        env.update(spec.env)
        env.update(spec.runner_env())
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in spec.gpu_indices)
        # CUDA's default order is "fastest first"; the calendar's indices are nvidia-smi's.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        if self.config.job_user:
            env["USER"] = env["LOGNAME"] = self.config.job_user
            env["HOME"] = self._job_dir(spec)
            env.pop("VIRTUAL_ENV", None)
            if is_runner_argv(tuple(spec.argv)) and spec.workdir:
                env["PYTHONPATH"] = spec.workdir  # the trainer's code, imported from the checkout
        return env

    def _job_dir(self, spec: RunSpec) -> str:
        """The isolated job's working directory: its own output folder, nothing of the server."""
        return str(Path(spec.output_dir).resolve()) if spec.output_dir else str(self._run_dir(spec.run_id) / "work")

    def _isolated(self, spec: RunSpec) -> tuple[list[str], str]:
        """(argv that drops to the job user, working directory), preparing what the job may touch."""
        uid, gid, _ = _job_identity(self.config.job_user)
        workdir = Path(self._job_dir(spec))
        workdir.mkdir(parents=True, exist_ok=True)
        # The state directory holds every run's spec (report tokens) and, by default, sits
        # beside the SQLite database: closed to the job user.
        os.chmod(self.state_dir, 0o700)
        if os.geteuid() == 0:
            os.chown(workdir, uid, gid)
            for path in workdir.rglob("*"):
                with contextlib.suppress(OSError):
                    os.lchown(path, uid, gid)
            drop = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
        else:  # needs a sudoers rule: <server user> ALL=(<job user>) NOPASSWD: ALL (README)
            drop = ["sudo", "-n", "-u", self.config.job_user, "--preserve-env", "--"]
        return [*drop, *spec.argv], str(workdir)

    def _launch(self, spec: RunSpec, run_dir: Path) -> None:
        log_path = self._log_path(spec)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        if spec.output_dir:
            Path(spec.output_dir).mkdir(parents=True, exist_ok=True)
        argv, workdir = list(spec.argv), spec.workdir or ""
        if self.config.job_user:
            argv, workdir = self._isolated(spec)
        cmd = [
            self.config.python,
            "-I",
            str(SUPERVISOR_SCRIPT),
            "--run-dir",
            str(run_dir),
            "--log",
            str(log_path),
            "--must-end-by",
            spec.must_end_by.isoformat(),
            "--grace-s",
            str(spec.grace_s),
            "--cwd",
            workdir,
            "--",
            *argv,
        ]
        with open(run_dir / "supervisor.err", "ab") as err:
            proc = subprocess.Popen(  # an argv list: no shell
                cmd,
                cwd=run_dir,
                env=self._child_env(spec),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,  # outlives the scheduler, out of its signals' way
                close_fds=True,
            )
        self._children[spec.run_id] = proc
        deadline = time.monotonic() + self.config.start_timeout_s
        while not (run_dir / "supervisor.json").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                break  # observe() will report what happened
            time.sleep(0.01)

    def stop(self, handle: Handle, grace_s: int) -> None:
        run_dir = self._run_dir(handle.run_id)
        if (run_dir / "exit.json").exists() or not (run_dir / "run.json").exists():
            return
        sv.write_json_atomic(
            run_dir / "stop.json",
            {"grace_s": int(grace_s), "requested_at": datetime.now(UTC).isoformat()},
        )
        supervisor = sv.read_json(run_dir / "supervisor.json")
        if self._alive(supervisor):
            with contextlib.suppress(ProcessLookupError):
                os.kill(supervisor["pid"], signal.SIGTERM)
            return
        child = sv.read_json(run_dir / "child.json")
        if self._alive(child):  # supervisor lost: signal the group ourselves, no escalation
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child["pgid"], signal.SIGTERM)

    def kill(self, handle: Handle) -> None:
        run_dir = self._run_dir(handle.run_id)
        if (run_dir / "exit.json").exists() or not (run_dir / "run.json").exists():
            return
        sv.write_json_atomic(run_dir / "kill.json", {"requested_at": datetime.now(UTC).isoformat()})
        supervisor = sv.read_json(run_dir / "supervisor.json")
        if self._alive(supervisor):  # first, so it records "killed"; covers a kill racing the spawn
            with contextlib.suppress(ProcessLookupError):
                os.kill(supervisor["pid"], signal.SIGUSR1)
        child = sv.read_json(run_dir / "child.json")
        if self._alive(child):  # directly too: works even with the supervisor hung or gone
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child["pgid"], signal.SIGKILL)

    def observe(self, *, teams: Iterable[str] = ()) -> list[ObservedRun]:
        self._reap()
        if not self.state_dir.is_dir():
            return []
        observed = []
        for run_dir in self.state_dir.iterdir():
            run_id = run_id_from_name(run_dir.name)
            if run_id is None or not (run_dir / "run.json").exists():
                continue
            observed.append(self._observe_one(run_id, run_dir))
        return sorted(observed, key=lambda o: o.run_id)

    def _observe_one(self, run_id: int, run_dir: Path) -> ObservedRun:
        handle = self._handle(run_id)
        for attempt in range(2):
            ended = sv.read_json(run_dir / "exit.json")
            if ended is not None:
                code = int(ended["exit_code"])
                return ObservedRun(
                    run_id=run_id,
                    state=state_for_exit_code(code),
                    handle=handle,
                    exit_code=code,
                    reason=str(ended.get("reason", "exited")),
                    detail=str(ended.get("detail", "")),
                )
            if attempt:
                break
            supervisor = sv.read_json(run_dir / "supervisor.json")
            if self._alive(supervisor):
                stopping = (run_dir / "stop.json").exists() or (run_dir / "kill.json").exists()
                reason = "stopping" if stopping else "running"
                return ObservedRun(run_id=run_id, state=RunState.RUNNING, handle=handle, reason=reason)
            if self._alive(sv.read_json(run_dir / "child.json")):
                return ObservedRun(
                    run_id=run_id,
                    state=RunState.RUNNING,
                    handle=handle,
                    reason="supervisor-lost",
                    detail="the supervisor died; the exit code will not be recorded",
                )
            # The supervisor may have written exit.json and exited since the first look.
        if supervisor is None:
            return ObservedRun(
                run_id=run_id,
                state=RunState.GONE,
                handle=handle,
                reason="not-launched",
                detail="start() was interrupted before the supervisor ran; start() again",
            )
        return ObservedRun(
            run_id=run_id,
            state=RunState.GONE,
            handle=handle,
            reason="lost",
            detail="the process ended without recording an exit code (reboot or SIGKILL)",
        )

    def cleanup(self, handle: Handle) -> None:
        run_dir = self._run_dir(handle.run_id)
        if not run_dir.exists():
            return
        self.kill(handle)
        self._reap()
        shutil.rmtree(run_dir, ignore_errors=True)

    def log_tail(self, handle: Handle, lines: int = 200) -> str:
        record = sv.read_json(self._run_dir(handle.run_id) / "run.json")
        path = Path(record["log_path"]) if record else self.log_dir / f"{handle.name}.log"
        return tail_file(path, lines)


def tail_file(path: Path, lines: int, block: int = 8192) -> str:
    """The last `lines` lines of a file, read from the end (logs can be gigabytes)."""
    if lines <= 0:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            pos = f.tell()
            data = b""
            while pos > 0 and data.count(b"\n") <= lines:
                step = min(block, pos)
                pos -= step
                f.seek(pos)
                data = f.read(step) + data
    except FileNotFoundError:
        return ""
    text = data.decode("utf-8", "replace")
    kept = text.splitlines(keepends=True)[-lines:]
    return "".join(kept)
