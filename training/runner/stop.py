"""Stopping at a batch boundary with a resumable checkpoint (ultralytics-offline.md §4.4).

A stop is requested by SIGTERM/SIGINT (the handler only records it) or by the clock
(``must_end_by - grace``). Ultralytics callbacks check the request:

* ``on_train_batch_end``: write a resumable ``last.pt`` (``trainer.save_model()``) and raise
  :class:`Preempted`. Ultralytics' own ``trainer.stop`` is no use: it validates, then
  ``final_eval()`` strips ``last.pt`` of its optimizer, so it cannot be resumed.
* ``on_val_batch_end`` (during training), ``on_train_epoch_start``, ``on_fit_epoch_end`` and
  ``on_train_start``: raise at once; the previous epoch's ``last.pt`` is still valid.

:class:`Preempted` is a ``BaseException`` so that nothing in Ultralytics swallows it.

A stop mid-epoch records the epoch as follows (:func:`recorded_epoch`). ``redo``: the
checkpoint says the previous epoch is done (with the mid-epoch weights) and the interrupted
epoch runs again, so results.csv stays contiguous. To make every slot move a job forward even
when one epoch is longer than a slot, an epoch that was already interrupted once is not
redone again but skipped. ``skip``: the interrupted epoch counts as done (no results.csv row).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SAVE_DELAY_ENV = "GPUBOOK_RUNNER_SAVE_DELAY_S"
SIDECAR_SUFFIX = ".stop.json"  # next to a checkpoint written mid-epoch: where it stopped


class Preempted(BaseException):  # a way out of model.train(), not an error
    """Raised from a callback to leave ``model.train()`` without ``final_eval()``."""


def recorded_epoch(epoch: int, epochs: int, mode: str, already_interrupted: int | None) -> int | None:
    """The 0-based epoch a mid-epoch checkpoint claims as done, or None if none can be saved.

    ``epoch`` is the 0-based epoch in progress; ``already_interrupted`` the 0-based epoch a
    previous stop interrupted (from the checkpoint this run resumed from), if any.
    Ultralytics resumes only when ``0 < recorded + 1 < epochs``.
    """
    redo_ok = epoch > 0
    skip_ok = epoch + 1 < epochs
    if mode == "redo" and redo_ok and (already_interrupted != epoch or not skip_ok):
        return epoch - 1
    if skip_ok:
        return epoch
    if redo_ok:
        return epoch - 1  # the last epoch cannot be recorded done: Ultralytics calls that finished
    return None  # the only epoch of a one-epoch run: nothing resumable to write


def read_sidecar(checkpoint: Path) -> dict[str, Any]:
    try:
        return json.loads(Path(str(checkpoint) + SIDECAR_SUFFIX).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def write_sidecar(checkpoint: Path, data: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        Path(str(checkpoint) + SIDECAR_SUFFIX).write_text(json.dumps(data), encoding="utf-8")


class GracefulStop:
    """Holds the stop request and the Ultralytics callbacks that act on it."""

    def __init__(
        self,
        *,
        stop_at: float | None,
        partial_epoch: str = "redo",
        clock: Callable[[], float] = time.time,
        save_mid_epoch: bool = True,
    ) -> None:
        self.stop_at = stop_at
        self.partial_epoch = partial_epoch
        # False where a mid-epoch checkpoint would never be resumed (a tune iteration restarts).
        self.save_mid_epoch = save_mid_epoch
        self.clock = clock
        self.reason: str | None = None
        self.requested_monotonic: float | None = None
        self.saving = threading.Event()
        self.already_interrupted: int | None = None  # set by the runner when resuming
        # Filled in when the callbacks act, for the termination message:
        self.checkpoint: Path | None = None
        self.checkpoint_epoch: int | None = None  # epochs done according to the checkpoint
        self.stopped_in_epoch: int | None = None  # 1-based
        self.save_s: float | None = None
        self.after_batch: Callable[[Any], None] | None = None  # test hook (batch delay)
        # Test hook: a checkpoint that takes this long to save (a large model's), so tests can
        # send signals while it is being written.
        self.save_delay_s = float(os.environ.get(SAVE_DELAY_ENV) or 0)
        self._in_epoch = False
        self._handlers_installed = False

    # -- requests ------------------------------------------------------------------------------

    def install_signal_handlers(self) -> GracefulStop:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self._handlers_installed = True
        return self

    def _on_signal(self, signum: int, frame: Any) -> None:
        # No I/O here: the main thread may be inside a write.
        if self.reason is None:
            self.reason = f"signal {signal.Signals(signum).name}"
            self.requested_monotonic = time.monotonic()
            # From now on the run is saving and exiting: further SIGTERMs are ignored by the
            # kernel itself. (A Python handler would not do: the interpreter restores the
            # default action while it shuts down, and a SIGTERM then kills it with 143 after
            # it wrote "checkpointed". SIG_IGN is kept through shutdown.)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        elif signum == signal.SIGINT and not self.saving.is_set() and self.checkpoint is None:
            os._exit(128 + signum)  # Ctrl-C twice at a terminal, with nothing being saved: give up now
        # A repeated SIGTERM is ignored: the run is already saving and exiting, and dying of
        # it would turn a good checkpoint into a failure. SIGKILL after the grace is the backstop.

    def requested(self) -> bool:
        if self.reason is None and self.stop_at is not None and self.clock() >= self.stop_at:
            self.reason = "must_end_by"
            self.requested_monotonic = time.monotonic()
            if self._handlers_installed and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stopping already: see _on_signal
        return self.reason is not None

    # -- callbacks -----------------------------------------------------------------------------

    def attach(self, model: Any) -> None:
        model.add_callback("on_train_start", self.on_boundary)
        model.add_callback("on_train_epoch_start", self.on_boundary)
        model.add_callback("on_train_batch_end", self.on_train_batch_end)
        model.add_callback("on_val_batch_end", self.on_val_batch_end)
        model.add_callback("on_train_epoch_end", self.on_train_epoch_end)
        model.add_callback("on_fit_epoch_end", self.on_fit_epoch_end)

    def on_boundary(self, trainer: Any) -> None:
        if self.requested():
            raise Preempted

    def on_train_batch_end(self, trainer: Any) -> None:
        if self.after_batch is not None:
            self.after_batch(trainer)
        if not self.requested():
            return
        epoch = trainer.epoch
        mark = None
        if self.save_mid_epoch:
            mark = recorded_epoch(epoch, trainer.epochs, self.partial_epoch, self.already_interrupted)
        self.stopped_in_epoch = epoch + 1
        if mark is not None:
            saved = (trainer.epoch, trainer.fitness, trainer.save_period)
            self.saving.set()
            started = time.monotonic()
            try:
                # fitness nan: best.pt is left alone; save_period -1: no epochN.pt
                trainer.epoch, trainer.fitness, trainer.save_period = mark, float("nan"), -1
                trainer.save_model()
                if self.save_delay_s > 0:
                    time.sleep(self.save_delay_s)
                write_sidecar(trainer.last, {"checkpoint_epoch": mark, "interrupted_epoch": epoch})
            finally:
                trainer.epoch, trainer.fitness, trainer.save_period = saved
                self.saving.clear()
            self.save_s = time.monotonic() - started
            self.checkpoint, self.checkpoint_epoch = Path(trainer.last), mark + 1
        raise Preempted

    def on_val_batch_end(self, validator: Any) -> None:
        if getattr(validator, "training", False) and self.requested():
            raise Preempted

    def on_train_epoch_end(self, trainer: Any) -> None:
        self._in_epoch = True  # the next on_fit_epoch_end belongs to a training epoch

    def on_fit_epoch_end(self, trainer: Any) -> None:
        # Also fired once more by final_eval() (not a training epoch): never stop there.
        in_epoch, self._in_epoch = self._in_epoch, False
        if not in_epoch:
            return
        # last.pt of this epoch is written by now.
        self.checkpoint, self.checkpoint_epoch = Path(trainer.last), trainer.epoch + 1
        last_epoch = trainer.epoch + 1 >= trainer.epochs or trainer.stop
        if not last_epoch and self.requested():
            raise Preempted


class Watchdog:
    """At ``deadline`` (wall clock), if the process is still here, end it: no run outlives
    ``must_end_by`` even when a stop cannot reach a callback (a long dataset scan, a hang).

    ``on_fire`` writes the termination message and must not return; it is given at most
    10 more seconds if a checkpoint is being written at that moment.
    """

    def __init__(self, deadline: float, stop: GracefulStop, on_fire: Callable[[], None]) -> None:
        self._deadline = deadline
        self._stop = stop
        self._on_fire = on_fire
        self._cancelled = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpubook-deadline", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def cancel(self) -> None:
        self._cancelled.set()

    def _run(self) -> None:
        while not self._cancelled.is_set():
            left = self._deadline - time.time()
            if left <= 0:
                break
            self._cancelled.wait(min(left, 5.0))
        if self._cancelled.is_set():
            return
        give_up = time.monotonic() + 10.0
        while self._stop.saving.is_set() and time.monotonic() < give_up:
            time.sleep(0.05)
        if not self._cancelled.is_set():
            self._on_fire()


def patch_worker_process_group() -> None:
    """Move each DataLoader worker into its own process group.

    A SIGTERM to the whole group (``kill -TERM -PGID``, Ctrl-C, ``tini -g``) otherwise kills
    the workers and the main process dies with "DataLoader worker ... is killed by signal"
    before it can checkpoint. ``SIG_IGN`` in the workers is worse: the exit then hangs in
    multiprocessing's atexit join. ``seed_worker`` is looked up at call time, so replacing
    the module global is enough (recipe §4.6).
    """
    import ultralytics.data.build as build

    original = build.seed_worker
    if getattr(original, "_gpubook_patched", False):
        return

    def seed_worker(worker_id: int) -> None:
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)
        original(worker_id)

    seed_worker._gpubook_patched = True  # type: ignore[attr-defined]
    build.seed_worker = seed_worker
