"""Several GPUs of one node for one run: the runner's own DDP launch, stop and resume rules.

Ultralytics launches DDP itself (``utils/dist.py``): it cloudpickles the trainer and its
callbacks into a temporary script and runs ``torch.distributed.run``. That path needs
``cloudpickle`` fetched at run time (no downloads here), hands our stop callbacks to workers
that never installed a signal handler, and lets ``torchrun`` re-send signals on its own
schedule. So the runner launches the workers itself, with the environment
``torch.distributed`` reads (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``). Each worker is this same runner (``--ddp-rank r``): Ultralytics sees
``LOCAL_RANK`` set, does not launch again, and trains its share through its own
``_setup_ddp`` (NCCL on GPUs, gloo otherwise).

Signals: every worker runs in its own session, so a signal to the runner's process group
(the local executor's ``kill -TERM -PGID``) or to the runner alone (the kubelet's SIGTERM to
PID 1) reaches each worker exactly once, forwarded by the launcher. A worker that loses its
launcher dies with it (``PR_SET_PDEATHSIG``).

Stopping together: a rank that leaves while another is inside a collective hangs that one until
the process-group timeout. So at every batch end and epoch start the ranks all-reduce (MAX)
their stop flags and all leave at the same batch; rank 0 alone writes the resumable
checkpoint (Ultralytics saves only on rank 0 too), and every rank exits 75.

Exit: a worker ends with ``exit_worker`` (``os._exit``), not through interpreter teardown.
Teardown destroys the process group's C++ objects while their background threads may still be
joinable, and under CPU load a rank that had already written its checkpointed end was seen to
abort there ("terminate called without an active exception", SIGABRT: code -6), which made a
clean checkpoint count as a failed run. The ranks agreed to stop at the same batch, so no
collective is pending when they leave, and there is nothing left for teardown to do that the
run needs.

Resume: the checkpoint remembers how many GPUs trained it; resuming on a different number
changes the global batch and the learning-rate schedule, so it is refused in words unless the
spec sets ``allow_gpu_count_change``.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn

from training.runner.stop import GracefulStop, Preempted

DDP_RANK_ENV = "GPUBOOK_DDP_RANK"
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class WorkerCommand:
    rank: int
    argv: tuple[str, ...]
    env: Mapping[str, str]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def worker_commands(
    spec_path: Path,
    world_size: int,
    *,
    master_port: int,
    base_env: Mapping[str, str],
    python: str = sys.executable,
    argv_tail: Sequence[str] = (),
    module: str = "training.runner",
) -> list[WorkerCommand]:
    """One command per rank: ``python -m training.runner --spec S --ddp-rank r``.

    ``CUDA_VISIBLE_DEVICES`` is left as the executor set it: every worker sees all the run's
    GPUs and Ultralytics picks ``device[LOCAL_RANK]``."""
    if world_size < 2:
        raise ValueError("DDP needs at least two workers")
    commands = []
    for rank in range(world_size):
        env = {
            **base_env,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(master_port),
            DDP_RANK_ENV: str(rank),
        }
        argv = (python, "-m", module, "--spec", str(spec_path), "--ddp-rank", str(rank), *argv_tail)
        commands.append(WorkerCommand(rank=rank, argv=argv, env=env))
    return commands


def exit_worker(code: int, *streams: IO[str]) -> NoReturn:
    """End this DDP worker with ``code`` now: flush what it wrote, then ``os._exit``.

    Skips interpreter teardown on purpose (see "Exit" above): the exit code the launcher sees
    must be the one the worker chose, not a crash in a destructor after the work was saved."""
    for stream in (*streams, sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    logging.shutdown()
    os._exit(code)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Launcher:
    """Starts the workers, forwards one SIGTERM to each, and waits for them all.

    ``wait()`` returns the exit codes by rank. When a worker fails (a code other than 0 or 75)
    its peers get ``peer_wait_s`` to end on their own (a bad spec or device fails every rank,
    and rank 0 should say so in its own words), then a SIGTERM, then SIGKILL after
    ``kill_after_s``: left alone they would hang in their next collective."""

    def __init__(
        self,
        commands: Sequence[WorkerCommand],
        *,
        stdout0: IO[str] | int | None = None,
        kill_after_s: float = 30.0,
        peer_wait_s: float = 10.0,
        ok_codes: tuple[int, ...] = (0, 75),
    ) -> None:
        self.peer_wait_s = peer_wait_s
        self.commands = list(commands)
        self.stdout0 = stdout0
        self.kill_after_s = kill_after_s
        self.ok_codes = ok_codes
        self.processes: list[subprocess.Popen] = []
        self.forwarded: dict[int, int] = {}  # pid -> signals forwarded (never more than one)
        self.signalled_at: float | None = None
        self._lock = threading.Lock()

    def start(self) -> Launcher:
        for command in self.commands:
            self.processes.append(
                subprocess.Popen(
                    list(command.argv),
                    env=dict(command.env),
                    stdout=self.stdout0 if command.rank == 0 else subprocess.DEVNULL,
                    start_new_session=True,  # a group signal reaches the worker once: through us
                    preexec_fn=_die_with_parent,
                )
            )
        return self

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes]

    def install_signal_handlers(self) -> Launcher:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stop()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one stop is enough; shutdown must not die of a repeat

    def stop(self) -> None:
        """Ask every live worker to checkpoint and exit: one SIGTERM each, ever."""
        with self._lock:
            if self.signalled_at is None:
                self.signalled_at = time.monotonic()
            for process in self.processes:
                if process.poll() is None and not self.forwarded.get(process.pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(process.pid, signal.SIGTERM)
                    self.forwarded[process.pid] = 1

    def kill(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)

    def wait(self, poll_s: float = 0.1) -> list[int]:
        failed_at: float | None = None
        while True:
            codes = [process.poll() for process in self.processes]
            if all(code is not None for code in codes):
                return [int(code) for code in codes]
            if failed_at is None and any(code is not None and code not in self.ok_codes for code in codes):
                failed_at = time.monotonic()
            if failed_at is not None and self.signalled_at is None and time.monotonic() - failed_at > self.peer_wait_s:
                self.stop()
            since = self.signalled_at
            if since is not None and time.monotonic() - since > self.kill_after_s:
                self.kill()
            time.sleep(poll_s)


def overall_exit_code(codes: Sequence[int], *, succeeded: int = 0, checkpointed: int = 75, failed: int = 1) -> int:
    """The run's code from its workers': rank 0's, unless a rank failed (a worker killed by
    a signal has a negative code: that is a failure too)."""
    failures = [code for code in codes if code not in (succeeded, checkpointed)]
    if failures:
        return next((code for code in failures if code > 0), failed)
    if checkpointed in codes:
        return checkpointed
    return succeeded


# --- stopping together ---------------------------------------------------------------------------


def all_reduce_max(device: Any = None) -> Callable[[bool], bool]:
    """An ``agree`` function over the default process group: True if any rank says True."""
    import torch
    import torch.distributed as dist

    def agree(flag: bool) -> bool:
        tensor = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return bool(tensor.item())

    return agree


class DistributedStop(GracefulStop):
    """GracefulStop for one DDP rank: the ranks agree on the batch to stop at; rank 0 saves.

    Only callbacks that every rank runs in step take part (batch end, epoch start); the
    validation and epoch-end checks are left out: validation runs on rank 0 alone, and a
    collective there would hang."""

    def __init__(self, *, rank: int, agree: Callable[[bool], bool] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rank = rank
        self.agree = agree

    def _agreed(self, trainer: Any) -> bool:
        if self.agree is None:
            self.agree = all_reduce_max(getattr(trainer, "device", None))
        anyone = self.agree(self.requested())
        if anyone and self.reason is None:  # (our own signal may have landed during the collective)
            self.reason = "a peer rank was asked to stop"
            self.requested_monotonic = time.monotonic()
            # Stopping already: the launcher's SIGTERM, when it lands now, changes nothing (and
            # must not kill the interpreter while it shuts down; see GracefulStop._on_signal).
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return anyone

    def on_boundary(self, trainer: Any) -> None:
        if self._agreed(trainer):
            raise Preempted

    def on_train_start(self, trainer: Any) -> None:
        return None  # before the first collective is set up on every rank in step

    def on_train_batch_end(self, trainer: Any) -> None:
        if self.after_batch is not None:
            self.after_batch(trainer)
        if not self._agreed(trainer):
            return
        if self.rank != 0:
            self.stopped_in_epoch = trainer.epoch + 1
            raise Preempted
        after, self.after_batch = self.after_batch, None
        try:
            super().on_train_batch_end(trainer)  # saves the resumable last.pt, then raises
        finally:
            self.after_batch = after

    def on_val_batch_end(self, validator: Any) -> None:
        return None

    def on_fit_epoch_end(self, trainer: Any) -> None:
        in_epoch, self._in_epoch = self._in_epoch, False
        if in_epoch and self.rank == 0:
            self.checkpoint, self.checkpoint_epoch = Path(trainer.last), trainer.epoch + 1

    def attach(self, model: Any) -> None:
        model.add_callback("on_train_epoch_start", self.on_boundary)
        model.add_callback("on_train_batch_end", self.on_train_batch_end)
        model.add_callback("on_train_epoch_end", self.on_train_epoch_end)
        model.add_callback("on_fit_epoch_end", self.on_fit_epoch_end)


# --- resume on the same number of GPUs -----------------------------------------------------------


def device_count(device: Any) -> int | None:
    """GPUs in an Ultralytics/gpubook device value: "0,1" -> 2, [0] -> 1, "cpu" -> 0."""
    if device is None:
        return None
    if isinstance(device, list | tuple):
        return len(device)
    if isinstance(device, int):
        return 1
    text = str(device).strip().lower()
    if text in ("", "none"):
        return None
    if text in ("cpu", "mps"):
        return 0
    return len([part for part in text.replace("[", "").replace("]", "").split(",") if part.strip()])


def gpu_count_refusal(checkpoint_gpus: int | None, run_gpus: int, *, allowed: bool) -> str | None:
    """Why this run may not resume that checkpoint, or None. CPU and one GPU count alike
    (same global batch); a change to or from several GPUs is refused unless allowed."""
    if allowed or checkpoint_gpus is None or max(checkpoint_gpus, 1) == max(run_gpus, 1):
        return None
    return (
        f"the checkpoint was trained on {checkpoint_gpus} GPU(s) and this run has {max(run_gpus, 1)}; "
        "resuming on a different number of GPUs changes the global batch and the learning-rate "
        "schedule, so it is refused (book the same number of GPUs, or set "
        "allow_gpu_count_change: true in the spec to accept the change)"
    )
