"""A tiny supervisor between the local executor and one run's process.

Why it exists: a scheduler that restarts cannot `wait()` for a process it did not fork, so
the exit code of a run that outlived its scheduler would be lost. The executor therefore
starts this supervisor (in a new session, so it survives the scheduler), and the supervisor
starts the run's argv (never through a shell) in a process group of its own, waits for it,
and writes the exit code to the run's state directory.

It also carries the slot's backstop, so a slot ends on time with the scheduler down: at
`--must-end-by` it sends SIGTERM to the run's group and SIGKILL `--grace-s` later, as a
Kubernetes `activeDeadlineSeconds` would.

Signals it understands (sent by the executor):
- SIGTERM: stop. The first one is forwarded to the run's group; SIGKILL follows after the
  grace written to `stop.json` (or `--grace-s`). Repeats are noted and not forwarded: a
  second SIGTERM reaching a runner that is saving its checkpoint must never kill it.
- SIGUSR1: kill. SIGKILL to the run's group now.
SIGINT and SIGHUP are ignored: the supervisor has no terminal and must outlive its parent.

Files in the run directory (all written atomically; this module is stdlib-only and runs as a
script under `python -I`, so it imports nothing from the project):
- `supervisor.lock`: held for the supervisor's lifetime, so two supervisors of one run never
  both start it;
- `supervisor.json`: its pid and /proc start time; `child.json`: the same for the run;
- `exit.json`: exit_code (128+N for signal N), signal, reason, detail, times.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

EXIT_SPAWN_FAILED = 127
_LOCK_RETRY_S = 2.0  # an observer may hold the lock for microseconds; a rival holds it forever
_POLL_S = 0.05


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) of a process, or None if absent."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])  # fields 3 and 22 of proc(5)


def process_alive(pid: int | None, start_ticks: int | None) -> bool:
    """True only for the very process recorded: same pid, same start time, not a zombie."""
    if not pid or start_ticks is None:
        return False
    stat = proc_stat(pid)
    return stat is not None and stat[1] == start_ticks and stat[0] not in ("Z", "X", "x")


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _utcnow_iso() -> str:
    return datetime.now(UTC).isoformat()


class Supervisor:
    def __init__(self, args: argparse.Namespace) -> None:
        self.run_dir = Path(args.run_dir)
        self.log_path = Path(args.log)
        self.argv: list[str] = args.argv
        self.cwd: str | None = args.cwd or None
        self.deadline = datetime.fromisoformat(args.must_end_by).timestamp()
        self.grace_s = args.grace_s
        self.child: subprocess.Popen[bytes] | None = None
        self.log_fd: int | None = None
        self.reason = "exited"
        self.kill_at: float | None = None  # when SIGTERMed, the instant SIGKILL follows
        self.kill_requested = False

    # -- signals ------------------------------------------------------------------------
    def _signal_group(self, signum: int) -> None:
        if self.child is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.child.pid, signum)

    def _note(self, text: str) -> None:
        if self.log_fd is not None:
            with contextlib.suppress(OSError):
                os.write(self.log_fd, f"[gpubook supervisor] {_utcnow_iso()} {text}\n".encode())

    def on_sigterm(self, signum: int, frame: object) -> None:
        stop = read_json(self.run_dir / "stop.json") or {}
        grace = stop.get("grace_s", self.grace_s)
        grace = grace if isinstance(grace, int) and grace >= 0 else self.grace_s
        self._terminate("stopped", grace)

    def on_sigusr1(self, signum: int, frame: object) -> None:
        self.kill_requested = True
        if self.reason not in ("deadline",):
            self.reason = "killed"
        self._note("kill requested: SIGKILL to the run's process group")
        self._signal_group(signal.SIGKILL)

    def _terminate(self, reason: str, grace_s: int) -> None:
        kill_at = time.time() + grace_s
        if self.kill_at is not None:  # already stopping: the run has its SIGTERM
            self.kill_at = min(self.kill_at, kill_at)  # a shorter grace still counts
            self._note(f"{reason}: already stopping; SIGTERM not forwarded again")
            return
        self.kill_at = kill_at
        if self.reason == "exited":
            self.reason = reason
        self._note(f"{reason}: SIGTERM to the run's process group, SIGKILL in {grace_s}s")
        self._signal_group(signal.SIGTERM)

    # -- main ---------------------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, self.on_sigterm)
        signal.signal(signal.SIGUSR1, self.on_sigusr1)

        lock = open(self.run_dir / "supervisor.lock", "a+")  # noqa: SIM115 (held until exit)
        if not self._lock(lock):
            return 0  # another supervisor owns this run
        if (self.run_dir / "exit.json").exists():
            return 0  # the run already ended; never start it twice
        me = proc_stat(os.getpid())
        write_json_atomic(
            self.run_dir / "supervisor.json",
            {"pid": os.getpid(), "start_ticks": me[1] if me else None, "started_at": _utcnow_iso()},
        )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        started_at = _utcnow_iso()

        if self.kill_requested or self.kill_at is not None:
            return self._finish(128 + signal.SIGTERM, signal.SIGTERM, "ended before it started", started_at)
        try:
            self.child = subprocess.Popen(  # an argv list: no shell
                self.argv,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=self.log_fd,
                stderr=self.log_fd,
                process_group=0,  # its own group: signals to it never hit the supervisor
                close_fds=True,
            )
        except OSError as exc:
            self._note(f"could not start {self.argv[0]!r}: {exc}")
            self.reason = "spawn-failed"
            return self._finish(EXIT_SPAWN_FAILED, None, str(exc), started_at)
        child_stat = proc_stat(self.child.pid)
        write_json_atomic(
            self.run_dir / "child.json",
            {
                "pid": self.child.pid,
                "pgid": self.child.pid,
                "start_ticks": child_stat[1] if child_stat else None,
                "started_at": started_at,
            },
        )
        if self.kill_requested:  # a kill that raced the spawn
            self._signal_group(signal.SIGKILL)
        elif self.kill_at is not None:  # a stop that raced the spawn
            self._signal_group(signal.SIGTERM)

        self._wait_for_child()
        # Leftovers of the group (DataLoader workers, a forked helper) would keep GPU memory:
        # the run has ended, so they go too, before the child is reaped and its pgid freed.
        self._signal_group(signal.SIGKILL)
        returncode = self.child.wait()
        if returncode < 0:
            return self._finish(128 - returncode, -returncode, "", started_at)
        return self._finish(returncode, None, "", started_at)

    def _lock(self, lock: Any) -> bool:
        deadline = time.monotonic() + _LOCK_RETRY_S
        while True:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.01)

    def _wait_for_child(self) -> None:
        assert self.child is not None
        pid = self.child.pid
        while True:
            # WNOWAIT: learn that it exited without reaping, so its pgid stays ours until the
            # group is cleaned up.
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is not None and info.si_pid == pid:
                return
            now = time.time()
            if now >= self.deadline and self.kill_at is None:
                self._terminate("deadline", self.grace_s)
            if self.kill_at is not None and now >= self.kill_at:
                self._note("grace expired: SIGKILL to the run's process group")
                self._signal_group(signal.SIGKILL)
                self.kill_at = float("inf")
            time.sleep(_POLL_S)

    def _finish(self, exit_code: int, signum: int | None, detail: str, started_at: str) -> int:
        if self.reason == "exited" and (self.run_dir / "kill.json").exists():
            self.reason = "killed"  # the executor's SIGKILL can beat our SIGUSR1 handler
        record = {
            "exit_code": exit_code,
            "signal": signum,
            "reason": self.reason,
            "detail": detail,
            "started_at": started_at,
            "ended_at": _utcnow_iso(),
        }
        self._note(f"run ended: exit code {exit_code} ({self.reason})")
        write_json_atomic(self.run_dir / "exit.json", record)
        return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="local_supervisor")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--must-end-by", required=True)
    parser.add_argument("--grace-s", type=int, required=True)
    parser.add_argument("--cwd", default="")
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.argv and args.argv[0] == "--":
        args.argv = args.argv[1:]
    if not args.argv:
        parser.error("no command given after --")
    return args


def main(argv: list[str] | None = None) -> int:
    return Supervisor(parse_args(sys.argv[1:] if argv is None else argv)).run()


if __name__ == "__main__":
    sys.exit(main())
