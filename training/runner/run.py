"""One training run, start to finish: plan (fresh / resume / already done), train, export,
register artifacts, and end with exactly one termination message and exit code.

Files under ``output_dir``::

    train/                 Ultralytics' save_dir: weights/{last,best}.pt, results.csv, args.yaml,
                           weights/best.onnx after the export
    .yolo/                 per-run YOLO_CONFIG_DIR (settings.json, a local Arial.ttf)
    events.jsonl           every progress event (progress.py)
    termination.json       how the run ended (termination.py)
    artifacts.json         the artifact manifest (artifacts.py), on success

An ``output_dir`` that already holds ``train/weights/last.pt`` is continued from it (the
executor may start the same run twice); otherwise ``resume_from`` is used; otherwise the
training starts from ``model``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import IO, Any

from training.runner import exitcodes
from training.runner.artifacts import write_manifest
from training.runner.checkpoints import (
    CheckpointError,
    CheckpointInfo,
    inspect_checkpoint,
    prepare_results_csv,
)
from training.runner.dataset import check_data_yaml
from training.runner.progress import Events, Reporter
from training.runner.spec import RunSpec
from training.runner.stop import (
    SIDECAR_SUFFIX,
    GracefulStop,
    Preempted,
    Watchdog,
    patch_worker_process_group,
    read_sidecar,
)
from training.runner.termination import termination_message, write_termination

SAVE_DIR_NAME = "train"
CONFIG_DIR_NAME = ".yolo"
EVENTS_FILE = "events.jsonl"
# Test and benchmark hook only: sleep this long after every train batch, so that a signal
# can be made to land in the middle of an epoch of a tiny dataset.
BATCH_DELAY_ENV = "GPUBOOK_RUNNER_BATCH_DELAY_S"
REPORT_FLUSH_ON_STOP_S = 2.0  # a stop has a deadline; do not spend it on reports
REPORT_FLUSH_ON_END_S = 5.0
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
ENGINE_NEEDS_CUDA = "engine (TensorRT) export needs a CUDA GPU and this run has none"
# What each export format leaves next to best.pt (OpenVINO's folder is zipped: _zip_folder).
EXPORT_SUFFIXES = {
    "onnx": ".onnx",
    "torchscript": ".torchscript",
    "engine": ".engine",
    "openvino": "_openvino_model.zip",
}


def export_target(source: Path, fmt: str) -> Path:
    return source.with_name(source.stem + EXPORT_SUFFIXES[fmt])


def run(spec: RunSpec, out: IO[str], *, ddp_rank: int | None = None) -> int:
    """Train as ``spec`` says, writing progress events to ``out``; return the exit code.

    With several GPUs this process launches one DDP worker per GPU (ddp.py) and waits; a
    worker (``ddp_rank`` set) trains its share, and rank 0 reports, exports and ends the run."""
    if spec.tune is not None:
        from training.runner.tune import TuneRunner

        return TuneRunner(spec, out).run()
    if spec.gpu_count > 1 and ddp_rank is None:
        return run_distributed(spec, out)
    return Runner(spec, out, ddp_rank=ddp_rank).run()


def run_distributed(spec: RunSpec, out: IO[str]) -> int:
    """The launcher of a multi-GPU run: start the workers, forward one SIGTERM to each, and
    end with rank 0's code. At ``must_end_by`` it kills what is left and records the last
    checkpoint, as a single-GPU run's watchdog does."""
    from training.runner import ddp

    spec.output_dir.mkdir(parents=True, exist_ok=True)
    refusal = _gpu_count_refusal(spec)
    if refusal:
        message = termination_message(
            run_id=spec.run_id, status="failed", exit_code=exitcodes.EXIT_FAILED, reason=refusal, error="checkpoint"
        )
        _end_without_rank0(spec, message, out)
        return exitcodes.EXIT_FAILED
    spec_path = spec.output_dir / f".ddp-spec-{spec.run_id}.json"
    spec_path.write_text(json.dumps(_spec_as_json(spec)), encoding="utf-8")
    spec_path.chmod(0o600)  # it holds the report token
    commands = ddp.worker_commands(
        spec_path, spec.gpu_count, master_port=ddp.free_port(), base_env=dict(os.environ)
    )
    out.flush()
    launched = time.time()
    launcher = ddp.Launcher(commands, stdout0=out.fileno(), kill_after_s=max(spec.grace_s, 10.0))
    launcher.install_signal_handlers()
    launcher.start()
    deadline = spec.must_end_by.timestamp() if spec.must_end_by else None
    stop_at = spec.stop_at()
    timer = None
    if stop_at is not None:
        timer = threading.Timer(max(stop_at - time.time(), 0.0), launcher.stop)
        timer.daemon = True
        timer.start()
    killer = None
    if deadline is not None:
        killer = threading.Timer(max(deadline - time.time(), 0.0), launcher.kill)
        killer.daemon = True
        killer.start()
    try:
        codes = launcher.wait()
    finally:
        for pending in (timer, killer):
            if pending is not None:
                pending.cancel()
        with contextlib.suppress(OSError):
            spec_path.unlink()
    code = ddp.overall_exit_code(
        codes, succeeded=exitcodes.EXIT_SUCCEEDED, checkpointed=exitcodes.EXIT_CHECKPOINTED,
        failed=exitcodes.EXIT_FAILED,
    )
    ending = spec.output_dir / "termination.json"
    if ending.is_file() and ending.stat().st_mtime >= launched and codes[0] >= 0:
        return code
    # Rank 0 did not record the end: killed at must_end_by, or it died.
    last = spec.output_dir / SAVE_DIR_NAME / "weights" / "last.pt"
    if deadline is not None and time.time() >= deadline:
        message = termination_message(
            run_id=spec.run_id, status="checkpointed", exit_code=exitcodes.EXIT_CHECKPOINTED,
            checkpoint=last if last.is_file() else None, reason="must_end_by reached before the DDP workers "
            "could stop at a batch boundary; the last completed epoch's checkpoint is kept", forced=True,
        )
        code = exitcodes.EXIT_CHECKPOINTED
    else:
        message = termination_message(
            run_id=spec.run_id, status="failed", exit_code=exitcodes.EXIT_FAILED,
            reason=f"DDP workers ended with codes {codes} before rank 0 recorded the end", error="internal",
        )
        code = exitcodes.EXIT_FAILED
    _end_without_rank0(spec, message, out)
    return code


def _end_without_rank0(spec: RunSpec, message: dict[str, Any], out: IO[str]) -> None:
    """The launcher records the end itself (same file, same event shape) when no rank did."""
    write_termination(message, spec.output_dir)
    event = {"run_id": spec.run_id, "event": message["status"], "epoch": message.get("epoch") or 0,
             "epochs": spec.epochs, "metrics": {}, "time": message["time"], "detail": message}
    out.write(json.dumps(event, separators=(",", ":")) + "\n")
    out.flush()


def _gpu_count_refusal(spec: RunSpec) -> str | None:
    """Checked by the launcher, before any worker starts (each worker checks again)."""
    own = spec.output_dir / SAVE_DIR_NAME / "weights" / "last.pt"
    candidate = own if own.is_file() else spec.resume_from
    if candidate is None:
        return None
    from training.runner.ddp import gpu_count_refusal
    from training.runner.offline import prepare_environment

    prepare_environment(spec.output_dir / CONFIG_DIR_NAME)
    try:
        info = inspect_checkpoint(candidate)
    except CheckpointError:
        return None  # rank 0 reports it in its own words
    if not info.resumable:
        return None
    return gpu_count_refusal(info.gpus, spec.gpu_count, allowed=spec.allow_gpu_count_change)


def _spec_as_json(spec: RunSpec) -> dict[str, Any]:
    from training.runner.cli import spec_summary

    data = spec_summary(spec)
    data["report_token"] = spec.report_token
    return {key: value for key, value in data.items() if value is not None}


class Runner:
    def __init__(self, spec: RunSpec, out: IO[str], *, ddp_rank: int | None = None) -> None:
        self.spec = spec
        self.out = out
        self.started = time.monotonic()
        self.save_dir = spec.output_dir / SAVE_DIR_NAME
        self.phase = "starting"
        self.events: Events | None = None
        self.rank = ddp_rank or 0  # only rank 0 reports, exports and writes the end
        if ddp_rank is not None:
            from training.runner.ddp import DistributedStop

            self.stop: GracefulStop = DistributedStop(
                rank=ddp_rank, stop_at=spec.stop_at(), partial_epoch=spec.partial_epoch
            )
        else:
            self.stop = GracefulStop(stop_at=spec.stop_at(), partial_epoch=spec.partial_epoch)
        self.epochs = spec.epochs
        self.resumed: CheckpointInfo | None = None
        self.trainer: Any = None
        self._live_trainer: Any = None  # set once Ultralytics has built its trainer
        self.train_s: float | None = None  # wall and CPU time spent in model.train()
        self.train_cpu_s: float | None = None
        self._ending = threading.Lock()  # one termination message, main thread or watchdog

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> int:
        self.stop.install_signal_handlers()
        spec = self.spec
        try:
            spec.output_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return self._end(
                "failed",
                exitcodes.EXIT_FAILED,
                reason=f"cannot create output_dir {spec.output_dir}: {exc.strerror}",
                error="spec",
            )
        reporter = None
        if spec.report_url and spec.report_token and self.rank == 0:
            reporter = Reporter(spec.report_url, spec.report_token)
        if self.rank == 0:
            self.events = Events(spec.run_id, self.out, log_file=spec.output_dir / EVENTS_FILE, reporter=reporter)
        else:  # the other DDP ranks train silently: rank 0 speaks for the run
            self.events = Events(spec.run_id, open(os.devnull, "w"))  # noqa: SIM115 (lives as long as the run)
        self.events.epochs = spec.epochs
        delay = float(os.environ.get(BATCH_DELAY_ENV) or 0)
        if delay > 0:
            self.stop.after_batch = lambda trainer: time.sleep(delay)
        watchdog = None
        if spec.must_end_by is not None:
            watchdog = Watchdog(spec.must_end_by.timestamp(), self.stop, self._deadline_passed)
            watchdog.start()
        try:
            return self._run()
        except Preempted:
            return self._checkpointed()
        except CheckpointError as exc:
            return self._failed("checkpoint", str(exc), exc)
        except Exception as exc:
            return self._failed(*self._classify(exc), exc)
        finally:
            if watchdog is not None:
                watchdog.cancel()

    def _setup(self) -> Any:
        """Offline switches, Ultralytics' import and the device check; returns ``YOLO``."""
        self.phase = "setup"
        from training.runner.offline import prepare_environment, quiet_settings

        prepare_environment(self.spec.output_dir / CONFIG_DIR_NAME)
        from ultralytics import YOLO  # after prepare_environment: import-time checks read it

        quiet_settings(self.spec.output_dir)
        patch_worker_process_group()
        self._check_devices()
        return YOLO

    def _run(self) -> int:
        spec = self.spec
        YOLO = self._setup()

        self.phase = "checkpoint"
        plan, info = self._plan()
        if plan == "finished":
            self.epochs = info.epochs or spec.epochs
            return self._finish()
        if self.stop.requested():  # must_end_by - grace already passed, or a signal
            raise Preempted

        self.phase = "data"
        check_data_yaml(spec.data)  # before Ultralytics can exec a `download:` entry

        self.phase = "model"
        if plan == "resume":
            self.resumed = info
            self.epochs = info.epochs or spec.epochs
            if info.epochs and info.epochs != spec.epochs:
                self._warn(
                    f"resuming a {info.epochs}-epoch training; the spec's epochs={spec.epochs} "
                    "is ignored (Ultralytics keeps a checkpoint's epochs)"
                )
            sidecar = read_sidecar(info.path)
            if sidecar.get("checkpoint_epoch") == info.epoch:
                self.stop.already_interrupted = sidecar.get("interrupted_epoch")
            prepare_results_csv(self.save_dir, info)
            model = YOLO(str(info.path))
        else:
            model = YOLO(spec.model)
        self.events.epochs = self.epochs
        _Progress(self).attach(model)
        self.stop.attach(model)

        self.phase = "trainer"
        args = self._train_args(resume=plan == "resume")
        trainer_class = self._trainer_class(model)
        started, cpu_started = time.monotonic(), time.process_time()
        try:
            model.train(trainer=trainer_class, **args)
        finally:
            self.trainer = getattr(model, "trainer", None)
        self.train_s = time.monotonic() - started
        self.train_cpu_s = time.process_time() - cpu_started
        return self._finish()

    def _plan(self) -> tuple[str, CheckpointInfo | None]:
        """("fresh" | "resume" | "finished", checkpoint info)."""
        own = self.save_dir / "weights" / "last.pt"
        candidate = own if own.is_file() else self.spec.resume_from
        if candidate is None:
            return "fresh", None
        info = inspect_checkpoint(candidate)
        if info.resumable and not info.all_epochs_done:
            from training.runner.ddp import gpu_count_refusal

            refusal = gpu_count_refusal(
                info.gpus, self.spec.gpu_count, allowed=self.spec.allow_gpu_count_change
            )
            if refusal:
                raise CheckpointError(refusal)
            return "resume", info
        if candidate == own:
            # Stripped by final_eval (or killed right after the last epoch): training is done.
            return "finished", info
        raise CheckpointError(
            f"checkpoint {candidate} is a finished model (no optimizer/epoch state), not a "
            "resumable training checkpoint; to fine-tune from it, pass it as 'model' instead"
        )

    def _train_args(self, *, resume: bool) -> dict[str, Any]:
        spec = self.spec
        args: dict[str, Any] = {
            "data": str(spec.data),
            "imgsz": spec.imgsz,
            "batch": spec.batch,
            "device": spec.ultralytics_device,
            "workers": spec.workers,
            "save_dir": str(self.save_dir),
            "plots": spec.extra.get("plots", True),
            "val": spec.extra.get("val", True),
        }
        if resume:
            args["resume"] = True
        else:
            args.update(spec.extra)
            args.update(epochs=spec.epochs, exist_ok=True, save=True)
        return args

    def _trainer_class(self, model: Any) -> type | None:
        """Ultralytics forces workers=0 on CPU; honour the spec's workers there too."""
        if self.spec.device != "cpu" or self.spec.workers == 0:
            return None
        base = model.task_map[model.task]["trainer"]
        workers = self.spec.workers

        class Trainer(base):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self.args.workers = workers

        Trainer.__name__ = Trainer.__qualname__ = base.__name__
        return Trainer

    def _check_devices(self) -> None:
        if self.spec.device == "cpu":
            return
        import torch

        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if max(self.spec.device) >= visible:
            raise _DeviceError(
                f"device {list(self.spec.device)} requested but {visible} CUDA device(s) are "
                f"visible (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
            )

    # -- the end --------------------------------------------------------------------------------

    def _finish(self) -> int:
        """Export, write the manifest and end as succeeded."""
        if self.rank != 0:
            return exitcodes.EXIT_SUCCEEDED
        self.phase = "export"
        weights = self.save_dir / "weights"
        best = weights / "best.pt"
        source = best if best.is_file() else weights / "last.pt"
        exported: list[Path] = []
        for fmt in self.spec.export:
            if self.stop.requested():
                self._warn(f"stop requested: {fmt} export skipped")
                break
            path = self._export(source, fmt)
            if path is not None:
                exported.append(path)
        files = [
            (best, "weights"),
            (weights / "last.pt", "weights"),
            *((path, "export") for path in exported),
            (self.save_dir / "results.csv", "metrics"),
            (self.save_dir / "results.png", "plot"),
            (self.save_dir / "args.yaml", "config"),
        ]
        with contextlib.suppress(OSError):  # stale once the run is done
            Path(str(weights / "last.pt") + SIDECAR_SUFFIX).unlink(missing_ok=True)
        manifest, artifacts = write_manifest(self.spec.run_id, self.spec.output_dir, files)
        self._emit(
            "artifacts",
            epoch=self.epochs,
            detail={
                "manifest": str(manifest),
                "artifacts": artifacts,
            },
        )
        return self._end(
            "succeeded",
            exitcodes.EXIT_SUCCEEDED,
            reason="done",
            epoch=self.epochs,
            weights=str(source) if source.is_file() else None,
            manifest=str(manifest),
            train_s=_round(self.train_s),
            train_cpu_s=_round(self.train_cpu_s),
        )

    def _export(self, source: Path, fmt: str) -> Path | None:
        """One export format; a failure is reported and the run still succeeds with the rest.

        OpenVINO writes a folder; it is zipped into ``best_openvino_model.zip`` so that every
        export is one artifact with one checksum."""
        if fmt == "engine" and self.spec.device == "cpu":
            # TensorRT builds an engine for the GPU it runs on; there is none here.
            self._emit(
                "export",
                epoch=self.epochs,
                detail={"format": fmt, "ok": False, "error": ENGINE_NEEDS_CUDA},
            )
            self._warn(f"engine export skipped: {ENGINE_NEEDS_CUDA}")
            return None
        target = export_target(source, fmt)
        if target.is_file() and target.stat().st_mtime >= source.stat().st_mtime:
            self._emit(
                "export",
                epoch=self.epochs,
                detail={
                    "format": fmt,
                    "ok": True,
                    "path": str(target),
                    "reused": True,
                },
            )
            return target
        from ultralytics import YOLO

        started = time.monotonic()
        device = "cpu" if fmt != "engine" else str(self.spec.device[0])
        try:
            path = Path(YOLO(str(source)).export(format=fmt, imgsz=self.spec.imgsz, device=device))
            if path.is_dir():
                path = _zip_folder(path, target)
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            self._emit(
                "export",
                epoch=self.epochs,
                detail={
                    "format": fmt,
                    "ok": False,
                    "error": f"{type(exc).__name__}: {_clean(exc)}",
                },
            )
            return None
        self._emit(
            "export",
            epoch=self.epochs,
            metrics={"export_s": time.monotonic() - started},
            detail={"format": fmt, "ok": True, "path": str(path)},
        )
        return path

    def _checkpointed(self) -> int:
        self._close_loaders()
        stop = self.stop
        checkpoint, epoch = stop.checkpoint, stop.checkpoint_epoch
        if checkpoint is None and self.resumed is not None:
            checkpoint, epoch = self.resumed.path, self.resumed.completed
        elif checkpoint is None:
            own = self.save_dir / "weights" / "last.pt"
            if own.is_file():
                checkpoint = own
        since = stop.requested_monotonic
        return self._end(
            "checkpointed",
            exitcodes.EXIT_CHECKPOINTED,
            reason=stop.reason or "stopped",
            checkpoint=checkpoint,
            epoch=epoch or 0,
            stopped_in_epoch=stop.stopped_in_epoch,
            stop_s=_round(time.monotonic() - since) if since is not None else None,
            save_s=_round(stop.save_s),
            flush_s=REPORT_FLUSH_ON_STOP_S,
        )

    def _failed(self, error: str, reason: str, exc: BaseException) -> int:
        if not isinstance(exc, CheckpointError | _DeviceError):
            traceback.print_exception(exc, file=sys.stderr)
        self._close_loaders()
        return self._end("failed", exitcodes.EXIT_FAILED, reason=reason, error=error)

    def _deadline_passed(self) -> None:
        """Watchdog: must_end_by has arrived and the process is still here."""
        code = self._end(
            "checkpointed",
            exitcodes.EXIT_CHECKPOINTED,
            reason="must_end_by reached before the run could stop at a batch boundary "
            f"(during {self.phase}); the last completed epoch's checkpoint is kept",
            checkpoint=self.stop.checkpoint or (self.resumed.path if self.resumed else None),
            epoch=self.stop.checkpoint_epoch or (self.resumed.completed if self.resumed else 0),
            forced=True,
            flush_s=1.0,
        )
        if code is not None:
            os._exit(code)

    def _end(
        self,
        status: str,
        code: int,
        *,
        reason: str,
        epoch: int = 0,
        checkpoint: Path | None = None,
        stopped_in_epoch: int | None = None,
        error: str | None = None,
        flush_s: float = REPORT_FLUSH_ON_END_S,
        **more: Any,
    ) -> int | None:
        # The main thread waits if the watchdog is ending the process (it never returns);
        # the watchdog gives way (None) if the main thread is ending the run already.
        if not self._ending.acquire(blocking=threading.current_thread() is threading.main_thread()):
            return None
        if self.rank != 0:  # rank 0 records the end of a DDP run
            print(f"gpubook-runner rank {self.rank}: {status}: {reason}", file=sys.stderr, flush=True)
            return code
        message = termination_message(
            run_id=self.spec.run_id,
            status=status,
            exit_code=code,
            checkpoint=checkpoint,
            epoch=epoch,
            epochs=self.epochs,
            stopped_in_epoch=stopped_in_epoch,
            reason=reason,
            error=error,
            **{k: v for k, v in more.items() if v is not None},
        )
        write_termination(message, self.spec.output_dir)
        if self.events is not None:
            self._emit(status, epoch=epoch, detail=message)
            self.events.close(flush_s)
        else:
            import json

            self.out.write(json.dumps(message) + "\n")
            self.out.flush()
        return code

    # -- helpers --------------------------------------------------------------------------------

    def _emit(self, event: str, **kwargs: Any) -> None:
        if self.events is not None:
            self.events.emit(event, **kwargs)

    def _warn(self, message: str) -> None:
        print(f"gpubook-runner: {message}", file=sys.stderr, flush=True)
        self._emit("warning", epoch=0, detail={"message": message})

    def _close_loaders(self) -> None:
        trainer = self.trainer or self._live_trainer
        for name in ("train_loader", "test_loader"):
            loader = getattr(trainer, name, None)
            if hasattr(loader, "close"):
                with contextlib.suppress(Exception):
                    loader.close()

    def _classify(self, exc: BaseException) -> tuple[str, str]:
        """(error kind, a reason a person can act on) for an exception during ``phase``."""
        spec, text = self.spec, _clean(exc) or type(exc).__name__
        name = type(exc).__name__
        if name == "OutOfMemoryError" or "out of memory" in text.lower():
            return "out_of_memory", (
                f"out of memory on device {spec.ultralytics_device} with batch={spec.batch}, "
                f"imgsz={spec.imgsz}: lower batch or imgsz, or use batch=-1 (AutoBatch) "
                f"[{text[:200]}]"
            )
        if isinstance(exc, _DeviceError) or (self.phase == "trainer" and "device" in text.lower()):
            return "device", text
        if self.phase == "data":
            # Ultralytics' own wording repeats the path and ends with a download hint.
            text = re.sub(r"^Dataset '[^']*' error\W*", "", text).split(" Note dataset download")[0]
            return "data", f"dataset {spec.data} cannot be used: {text}"
        if self.phase == "model":
            return "model", f"model {spec.model} cannot be loaded or built: {name}: {text}"
        return "internal", f"{self.phase} failed: {name}: {text}"


class _DeviceError(RuntimeError):
    pass


class _Progress:
    """Ultralytics callbacks that turn training into progress events (recipe §5)."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.batch = 0
        self.batches_done = 0
        self.train_started = time.monotonic()
        self.in_epoch = False

    def attach(self, model: Any) -> None:
        model.add_callback("on_pretrain_routine_start", self.on_pretrain_routine_start)
        model.add_callback("on_pretrain_routine_end", self.on_pretrain_routine_end)
        model.add_callback("on_train_start", self.on_train_start)
        model.add_callback("on_train_epoch_start", self.on_train_epoch_start)
        model.add_callback("on_train_batch_end", self.on_train_batch_end)
        model.add_callback("on_train_epoch_end", self.on_train_epoch_end)
        model.add_callback("on_fit_epoch_end", self.on_fit_epoch_end)

    def on_pretrain_routine_start(self, trainer: Any) -> None:
        self.runner.phase = "data"  # next: the data YAML check, then model and dataloaders
        self.runner._live_trainer = trainer

    def on_pretrain_routine_end(self, trainer: Any) -> None:
        self.runner.phase = "training"

    def on_train_start(self, trainer: Any) -> None:
        runner = self.runner
        runner.epochs = runner.events.epochs = trainer.epochs
        self.train_started = time.monotonic()
        resumed = runner.resumed.path if runner.resumed else None
        runner._emit(
            "started",
            epoch=trainer.start_epoch,
            metrics={"batches": len(trainer.train_loader), "start_epoch": trainer.start_epoch},
            detail={
                "resumed_from": str(resumed) if resumed else None,
                "save_dir": str(trainer.save_dir),
                "model": runner.spec.model,
                "device": str(trainer.device),
                "workers": getattr(trainer.train_loader, "num_workers", None),
            },
        )

    def on_train_epoch_start(self, trainer: Any) -> None:
        self.batch = 0

    def on_train_batch_end(self, trainer: Any) -> None:
        self.batch += 1
        self.batches_done += 1
        batches = len(trainer.train_loader)
        remaining = (trainer.epochs - trainer.epoch) * batches - self.batch
        metrics = {
            "batch": self.batch,
            "batches": batches,
            **(trainer.label_loss_items(trainer.tloss) if trainer.tloss else {}),
            "lr": trainer.optimizer.param_groups[0]["lr"],
            **self._times(remaining),
        }
        self.runner.events.batch(epoch=trainer.epoch + 1, first_of_epoch=self.batch == 1, metrics=metrics)

    def on_train_epoch_end(self, trainer: Any) -> None:
        self.in_epoch = True

    def on_fit_epoch_end(self, trainer: Any) -> None:
        in_epoch, self.in_epoch = self.in_epoch, False
        metrics = dict(trainer.metrics or {})
        if not in_epoch:  # final_eval() validating best.pt
            self.runner._emit("final", epoch=trainer.epochs, metrics=metrics)
            return
        remaining = (trainer.epochs - trainer.epoch - 1) * len(trainer.train_loader)
        metrics.update(trainer.label_loss_items(trainer.tloss) if trainer.tloss else {})
        metrics.update(trainer.lr or {})
        metrics.update(fitness=trainer.fitness, epoch_time_s=getattr(trainer, "epoch_time", None))
        metrics.update(self._times(remaining))
        self.runner._emit("epoch", epoch=trainer.epoch + 1, metrics=metrics)

    def _times(self, remaining_batches: int) -> dict[str, float]:
        now = time.monotonic()
        per_batch = (now - self.train_started) / max(self.batches_done, 1)
        return {
            "elapsed_s": now - self.runner.started,
            "eta_s": max(remaining_batches, 0) * per_batch,
        }


def _clean(exc: BaseException) -> str:
    text = _ANSI.sub("", str(exc))
    text = " ".join(text.split())
    return text[:600]


def _zip_folder(folder: Path, target: Path) -> Path:
    """Zip an export folder into ``target`` (written under a temporary name, then renamed)."""
    import zipfile

    partial = target.with_name(target.name + ".partial")
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for file in sorted(folder.rglob("*")):
            if file.is_file():
                archive.write(file, arcname=(Path(folder.name) / file.relative_to(folder)).as_posix())
    partial.replace(target)
    return target


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
