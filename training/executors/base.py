"""The one interface every executor speaks, and the value types that cross it.

An executor turns a `RunSpec` (what to run, where, until when) into a running process
(`start`), asks it to checkpoint and end (`stop`), ends it now (`kill`), reports what
exists (`observe`) and forgets what is finished (`cleanup`). Executors know nothing of
Django: reconcile builds the spec from the database and stores what `observe` says.

Names are deterministic (`run_name(run_id)`), so a repeated `start` of the same run finds
the existing process or Job instead of starting a second one. Every method is idempotent:
reconcile may call any of them again after a crash.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

from training.runner.exitcodes import EXIT_CHECKPOINTED, EXIT_SUCCEEDED

RUN_NAME_PREFIX = "gpubook-run-"

# Set by the executor, never by the caller: the GPU selection is the executor's job (and on
# Kubernetes kubelet's), and the GPUBOOK_ variables are the contract with the runner.
RESERVED_ENV_NAMES = frozenset({"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES"})
RESERVED_ENV_PREFIXES = ("GPUBOOK_", "NVIDIA_")

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def run_name(run_id: int) -> str:
    """The one name a run has everywhere: process state dir, Job, pod prefix, log file."""
    if isinstance(run_id, bool) or not isinstance(run_id, int) or run_id <= 0:
        raise ValueError(f"run_id must be a positive int, got {run_id!r}")
    return f"{RUN_NAME_PREFIX}{run_id}"


def run_id_from_name(name: str) -> int | None:
    """Inverse of `run_name`; None for names that are not ours."""
    if not name.startswith(RUN_NAME_PREFIX):
        return None
    tail = name[len(RUN_NAME_PREFIX) :]
    return int(tail) if tail.isdigit() and not tail.startswith("0") else None


class ExecutorError(Exception):
    """An executor could not do what was asked. Reconcile retries on the next tick."""


class ExecutorUnavailable(ExecutorError):
    """The backend did not answer (timeout, connection refused, 5xx, 429) after retries."""


class ImageNotAllowed(ExecutorError, ValueError):
    """The image is not in the executor's allowlist; retrying will not help."""


class RunSpecMismatch(ExecutorError):
    """A run with this id already exists but was started from a different spec."""


class RunState(enum.StrEnum):
    RUNNING = "running"  # started and not ended; may still be pending (see `reason`)
    SUCCEEDED = "succeeded"  # exit code EXIT_SUCCEEDED
    FAILED = "failed"  # any other exit code, or a platform failure without one
    CHECKPOINTED = "checkpointed"  # exit code EXIT_CHECKPOINTED: resumable
    # Ended after stop() or kill() and the platform kept no exit status (Kubernetes deletes
    # the pod it stops). Whether a checkpoint was written must come from the runner's own
    # report or the runs volume.
    STOPPED = "stopped"
    # The executor has a record of the run, but the process or Job vanished without an exit
    # status (host reboot, supervisor SIGKILLed, Job deleted by someone else).
    GONE = "gone"

    @property
    def ended(self) -> bool:
        return self is not RunState.RUNNING


def state_for_exit_code(exit_code: int) -> RunState:
    if exit_code == EXIT_SUCCEEDED:
        return RunState.SUCCEEDED
    if exit_code == EXIT_CHECKPOINTED:
        return RunState.CHECKPOINTED
    return RunState.FAILED


@dataclass(frozen=True)
class RunSpec:
    """Everything an executor needs to start one run. Built by reconcile, never mutated.

    `must_end_by` is the hard end (the slot end for a reserved run, the next reservation's
    start for backfill). The runner is told it (GPUBOOK_MUST_END_BY) and stops itself in
    time; executors also install a backstop at that instant. `grace_s` is how long the
    process gets between SIGTERM and SIGKILL to write its checkpoint.
    """

    run_id: int
    image: str
    argv: tuple[str, ...]
    node_name: str
    gpu_indices: tuple[int, ...]
    team: str
    job_id: int
    must_end_by: datetime
    grace_s: int
    reservation_id: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    gpu_count: int | None = None  # defaults to len(gpu_indices)
    gpu_uuids: tuple[str, ...] = ()  # only for Kubernetes DRA pinning
    workdir: str | None = None  # working directory of the process
    output_dir: str | None = None  # where the run writes checkpoints (as the process sees it)
    log_path: str | None = None  # local executor only; default: the run's state dir
    cpu: str | None = None  # Kubernetes quantity, e.g. "8"
    memory: str | None = None  # Kubernetes quantity, e.g. "32Gi"
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        run_name(self.run_id)  # validates
        if isinstance(self.argv, str):
            raise ValueError("argv must be a list of strings, never a shell string")
        argv = tuple(self.argv)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError("argv must be a non-empty list of strings")
        if any("\x00" in a for a in argv):
            raise ValueError("argv must not contain NUL bytes")
        object.__setattr__(self, "argv", argv)
        indices = tuple(self.gpu_indices)
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in indices):
            raise ValueError(f"gpu_indices must be non-negative ints, got {indices!r}")
        if len(set(indices)) != len(indices):
            raise ValueError(f"gpu_indices must not repeat, got {indices!r}")
        object.__setattr__(self, "gpu_indices", indices)
        count = len(indices) if self.gpu_count is None else self.gpu_count
        if indices and count != len(indices):
            raise ValueError(f"gpu_count {count} does not match gpu_indices {indices!r}")
        if count < 0:
            raise ValueError("gpu_count must be >= 0")
        object.__setattr__(self, "gpu_count", count)
        object.__setattr__(self, "gpu_uuids", tuple(self.gpu_uuids))
        if not isinstance(self.image, str) or not self.image or any(c.isspace() for c in self.image):
            raise ValueError(f"bad image reference {self.image!r}")
        if not self.team:
            raise ValueError("team must not be empty")
        if self.must_end_by.tzinfo is None or self.must_end_by.utcoffset() is None:
            raise ValueError("must_end_by must be timezone-aware")
        object.__setattr__(self, "must_end_by", self.must_end_by.astimezone(UTC))
        if isinstance(self.grace_s, bool) or not isinstance(self.grace_s, int) or self.grace_s < 0:
            raise ValueError("grace_s must be an int >= 0")
        env = dict(self.env)
        for key, value in env.items():
            if not isinstance(key, str) or not _ENV_NAME.match(key):
                raise ValueError(f"bad environment variable name {key!r}")
            if key in RESERVED_ENV_NAMES or key.startswith(RESERVED_ENV_PREFIXES):
                raise ValueError(f"environment variable {key} is set by the executor")
            if not isinstance(value, str):
                raise ValueError(f"environment variable {key} must be a string")
        object.__setattr__(self, "env", env)
        object.__setattr__(self, "labels", dict(self.labels))

    @property
    def name(self) -> str:
        return run_name(self.run_id)

    def runner_env(self) -> dict[str, str]:
        """Variables every executor sets for the runner, on top of `env`."""
        return {
            "GPUBOOK_RUN_ID": str(self.run_id),
            "GPUBOOK_JOB_ID": str(self.job_id),
            "GPUBOOK_MUST_END_BY": self.must_end_by.isoformat(),
            "GPUBOOK_GRACE_S": str(self.grace_s),
            **({"GPUBOOK_OUTPUT_DIR": self.output_dir} if self.output_dir else {}),
        }

    def as_json(self) -> dict[str, Any]:
        """A JSON-safe dict; canonical (sorted) so it can be hashed."""
        return {
            "run_id": self.run_id,
            "image": self.image,
            "argv": list(self.argv),
            "node_name": self.node_name,
            "gpu_indices": list(self.gpu_indices),
            "gpu_count": self.gpu_count,
            "gpu_uuids": list(self.gpu_uuids),
            "team": self.team,
            "job_id": self.job_id,
            "reservation_id": self.reservation_id,
            "must_end_by": self.must_end_by.isoformat(),
            "grace_s": self.grace_s,
            "env": dict(sorted(self.env.items())),
            "workdir": self.workdir,
            "output_dir": self.output_dir,
            "log_path": self.log_path,
            "cpu": self.cpu,
            "memory": self.memory,
            "labels": dict(sorted(self.labels.items())),
        }

    def spec_hash(self) -> str:
        """Identifies the spec a run was started from, to tell a retry from a clash."""
        canonical = json.dumps(self.as_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Handle:
    """How to find a started run again. Plain data: store `as_dict()` on the Run row."""

    run_id: int
    name: str
    executor: str  # "local" | "kubernetes"
    namespace: str | None = None  # Kubernetes only
    uid: str | None = None  # Kubernetes Job uid, when known

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "name": self.name,
            "executor": self.executor,
            "namespace": self.namespace,
            "uid": self.uid,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Handle:
        return cls(
            run_id=int(data["run_id"]),
            name=str(data["name"]),
            executor=str(data["executor"]),
            namespace=data.get("namespace"),
            uid=data.get("uid"),
        )


@dataclass(frozen=True)
class ObservedRun:
    """What an executor sees of one run right now.

    `reason` is a short machine-readable word (Kubernetes' own reasons where they exist:
    "Pending", "ImagePullBackOff", "OOMKilled", "DeadlineExceeded", "Suspended"; the local
    executor's: "running", "exited", "stopped", "killed", "deadline", "spawn-failed",
    "supervisor-lost", "lost"). `detail` is for people: a termination message or a hint.
    """

    run_id: int
    state: RunState
    handle: Handle
    exit_code: int | None = None
    reason: str = ""
    detail: str = ""


@runtime_checkable
class Executor(Protocol):
    kind: str

    def start(self, spec: RunSpec, *, now: datetime | None = None) -> Handle:
        """Start the run, or return the handle of the one already started for this run id.

        `now` is the caller's clock reading (reconcile's `now`); None reads the clock.

        Raises RunSpecMismatch if that earlier run came from a different spec, ImageNotAllowed
        for an image outside the allowlist, ValueError for a spec whose must_end_by has
        passed, ExecutorUnavailable when the backend did not answer.
        """
        ...

    def stop(self, handle: Handle, grace_s: int) -> None:
        """Ask the run to checkpoint and end: SIGTERM now, SIGKILL after grace_s."""
        ...

    def kill(self, handle: Handle) -> None:
        """End the run now (SIGKILL). Idempotent; a run already gone is fine."""
        ...

    def observe(self, *, teams: Iterable[str] = ()) -> list[ObservedRun]:
        """Every run this executor has a record of, running or ended, sorted by run id.

        `teams` widens the Kubernetes search to those teams' namespaces; the local executor
        ignores it. A run reconcile expects but that is absent here was never started (or
        was cleaned up).
        """
        ...

    def cleanup(self, handle: Handle) -> None:
        """Forget an ended run: delete its Job / state record (logs are kept locally).

        Call after the run's end was recorded; on a running run it also ends it (kill).
        """
        ...

    def log_tail(self, handle: Handle, lines: int = 200) -> str:
        """The last `lines` lines of the run's output ("" if there is none yet)."""
        ...
