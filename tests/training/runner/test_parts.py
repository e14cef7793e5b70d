"""The runner's parts one at a time: fast, no training."""

from __future__ import annotations

import io
import json
import math
import os
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.training.runner.support import REPORT_TOKEN
from training.runner import exitcodes
from training.runner.artifacts import sha256_of, write_manifest
from training.runner.checkpoints import CheckpointInfo, prepare_results_csv, read_results_epochs
from training.runner.progress import Events, Reporter, clean_metrics, metric_name
from training.runner.stop import (
    GracefulStop,
    Preempted,
    Watchdog,
    read_sidecar,
    recorded_epoch,
)
from training.runner.termination import termination_message, write_termination

# --- exit codes ----------------------------------------------------------------------------------


def test_exit_codes_are_distinct_and_named():
    codes = {exitcodes.EXIT_SUCCEEDED, exitcodes.EXIT_FAILED, exitcodes.EXIT_BAD_SPEC, exitcodes.EXIT_CHECKPOINTED}
    assert len(codes) == 4 and exitcodes.EXIT_CHECKPOINTED == 75
    assert exitcodes.describe(75) == "checkpointed"
    assert exitcodes.describe(-9) == "killed:9" and exitcodes.describe(137) == "killed:9"


# --- progress events and reports ------------------------------------------------------------


def test_metric_names():
    assert metric_name("train/box_loss") == "box_loss"
    assert metric_name("val/dfl_loss") == "val_dfl_loss"
    assert metric_name("metrics/mAP50-95(B)") == "mAP50-95"
    assert metric_name("metrics/mAP50(M)") == "mAP50(M)"
    assert metric_name("lr/pg0") == "lr" and metric_name("lr/pg2") == "lr_pg2"
    cleaned = clean_metrics({"a": 1, "b": float("nan"), "c": True, "d": "x", "e": 0.1234567891})
    assert cleaned == {"a": 1, "e": 0.123457}


def test_events_shape_and_batch_thinning(tmp_path):
    out = io.StringIO()
    now = [0.0]
    events = Events("r1", out, log_file=tmp_path / "events.jsonl", clock=lambda: now[0])
    events.epochs = 5
    events.emit("started", epoch=0, metrics={"batches": 4}, detail={"save_dir": "/x"})
    for step in range(10):  # 10 batches in 0.9 s: first of epoch, then at most 1 per second
        now[0] = step * 0.1
        events.batch(epoch=1, first_of_epoch=step == 0, metrics={"batch": step + 1})
    now[0] = 1.05
    events.batch(epoch=1, first_of_epoch=False, metrics={"batch": 11})
    events.batch(epoch=2, first_of_epoch=True, metrics={"batch": 1})
    events.close(0)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(line["event"], line["metrics"].get("batch")) for line in lines] == [
        ("started", None),
        ("batch", 1),
        ("batch", 11),
        ("batch", 1),
    ]
    assert set(lines[0]) == {"run_id", "event", "epoch", "epochs", "metrics", "time", "detail"}
    assert lines[0]["epochs"] == 5 and lines[0]["detail"] == {"save_dir": "/x"}
    logged = (tmp_path / "events.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in logged] == lines


def test_reporter_posts_with_the_token(report_server):
    reporter = Reporter(report_server.url, REPORT_TOKEN)
    events = Events("r1", io.StringIO(), reporter=reporter)
    events.epochs = 2
    events.emit("epoch", epoch=1, metrics={"mAP50": 0.5})
    events.emit("succeeded", epoch=2, detail={"status": "succeeded"})
    events.close(5)
    assert report_server.events() == ["epoch", "succeeded"]
    first = report_server.bodies[0]
    assert first["run_id"] == "r1" and first["metrics"] == {"mAP50": 0.5} and first["epochs"] == 2
    assert reporter.sent == 2 and reporter.failed == 0


def test_reporter_wrong_token_is_counted_not_raised(report_server, capsys):
    reporter = Reporter(report_server.url, "someone-elses-token", log=__import__("sys").stderr)
    reporter.submit({"event": "epoch"})
    assert reporter.close(5)
    assert reporter.failed == 1 and report_server.rejected == ["Bearer someone-elses-token"]
    assert "401" in capsys.readouterr().err


def test_reporter_never_blocks_training(report_server):
    report_server.delay_s = 1.0  # a slow web app
    reporter = Reporter(report_server.url, REPORT_TOKEN, buffer=4)
    started = time.monotonic()
    for index in range(20):
        reporter.submit({"event": "batch", "n": index})
    assert time.monotonic() - started < 0.1  # submit only queues
    closed = time.monotonic()
    assert reporter.close(0.3) is False  # bounded wait, gives up
    assert time.monotonic() - closed < 0.8
    assert reporter.dropped >= 15  # oldest dropped from the bounded buffer


def test_reporter_survives_an_unreachable_endpoint():
    reporter = Reporter("http://127.0.0.1:9/nothing-listens", REPORT_TOKEN, log=io.StringIO())
    reporter.submit({"event": "started"})
    assert reporter.close(5)
    assert reporter.failed == 1 and reporter.sent == 0


# --- stopping --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("epoch", "epochs", "mode", "interrupted", "expected"),
    [
        (2, 5, "redo", None, 1),  # redo: the previous epoch is the last one done
        (2, 5, "redo", 2, 2),  # interrupted there before: skip, so the job moves forward
        (0, 5, "redo", None, 0),  # nothing before epoch 0: skip it
        (4, 5, "redo", 4, 3),  # the last epoch can never be recorded done
        (2, 5, "skip", None, 2),
        (4, 5, "skip", None, 3),
        (0, 1, "redo", None, None),  # a one-epoch run has nothing resumable mid-epoch
    ],
)
def test_recorded_epoch(epoch, epochs, mode, interrupted, expected):
    assert recorded_epoch(epoch, epochs, mode, interrupted) == expected


class FakeTrainer:
    def __init__(self, tmp_path: Path, *, epoch: int = 2, epochs: int = 5) -> None:
        self.epoch, self.epochs = epoch, epochs
        self.fitness, self.save_period, self.stop = 0.25, 3, False
        self.last = tmp_path / "last.pt"
        self.saved: list[tuple] = []

    def save_model(self) -> bool:
        self.saved.append((self.epoch, self.fitness, self.save_period))
        self.last.write_bytes(b"ckpt")
        return True


def test_batch_end_saves_a_resumable_checkpoint_then_unwinds(tmp_path):
    now = [100.0]
    stop = GracefulStop(stop_at=150.0, clock=lambda: now[0])
    trainer = FakeTrainer(tmp_path)
    stop.on_train_batch_end(trainer)  # nothing requested yet
    assert trainer.saved == []
    now[0] = 150.0
    with pytest.raises(Preempted):
        stop.on_train_batch_end(trainer)
    assert stop.reason == "must_end_by"
    [(epoch, fitness, save_period)] = trainer.saved
    assert epoch == 1 and math.isnan(fitness) and save_period == -1
    assert (trainer.epoch, trainer.fitness, trainer.save_period) == (2, 0.25, 3)  # restored
    assert stop.checkpoint == trainer.last and stop.checkpoint_epoch == 2
    assert stop.stopped_in_epoch == 3
    assert read_sidecar(trainer.last) == {"checkpoint_epoch": 1, "interrupted_epoch": 2}


def test_epoch_boundaries(tmp_path):
    stop = GracefulStop(stop_at=None)
    trainer = FakeTrainer(tmp_path)
    stop.reason = "signal SIGTERM"
    stop.on_fit_epoch_end(trainer)  # final_eval's extra call: never stops there
    stop.on_train_epoch_end(trainer)
    with pytest.raises(Preempted):
        stop.on_fit_epoch_end(trainer)
    assert stop.checkpoint_epoch == 3
    trainer.epoch = 4  # the last epoch: let final_eval finish the run
    stop.on_train_epoch_end(trainer)
    stop.on_fit_epoch_end(trainer)
    with pytest.raises(Preempted):
        stop.on_boundary(trainer)
    stop.on_val_batch_end(SimpleNamespace(training=False))  # final validation: keep going
    with pytest.raises(Preempted):
        stop.on_val_batch_end(SimpleNamespace(training=True))


def test_signal_handler_only_sets_a_flag():
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        stop = GracefulStop(stop_at=None).install_signal_handlers()
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 2
        while stop.reason is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stop.reason == "signal SIGTERM" and stop.requested()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_watchdog_fires_at_the_deadline_and_waits_for_a_save():
    stop = GracefulStop(stop_at=None)
    fired = threading.Event()
    stop.saving.set()
    watchdog = Watchdog(time.time() + 0.1, stop, fired.set).start()
    assert not fired.wait(0.4)  # a checkpoint is being written: wait for it
    stop.saving.clear()
    assert fired.wait(2)
    cancelled = threading.Event()
    Watchdog(time.time() + 0.2, stop, cancelled.set).start().cancel()
    assert not cancelled.wait(0.5)
    watchdog.cancel()


# --- results.csv, termination, manifest ---------------------------------------------------------

HEADER = "epoch,time,train/box_loss,metrics/mAP50(B)"


def info(tmp_path: Path, epoch: int, results=None) -> CheckpointInfo:
    return CheckpointInfo(tmp_path / "old" / "weights" / "last.pt", epoch, 5, True, results)


def test_results_csv_trimmed_to_the_checkpoint(tmp_path):
    save_dir = tmp_path / "train"
    save_dir.mkdir()
    # A kill between the csv append and last.pt leaves an extra row; duplicates keep the last.
    (save_dir / "results.csv").write_text(f"{HEADER}\n1,1.0,0.9,0\n2,2.0,0.8,0\n2,2.5,0.7,0\n3,3.0,0.6,0\n")
    assert prepare_results_csv(save_dir, info(tmp_path, epoch=1)) == 2
    text = (save_dir / "results.csv").read_text()
    assert text == f"{HEADER}\n1,1.0,0.9,0\n2,2.5,0.7,0\n"
    assert read_results_epochs(save_dir / "results.csv") == [1, 2]


def test_results_csv_carried_into_a_new_directory(tmp_path):
    columns = {"epoch": [1, 2, 3], "time": [1.5, 2.5, 3.5], "train/box_loss": [0.9, 0.8, 0.7]}
    fresh = tmp_path / "new" / "train"
    assert prepare_results_csv(fresh, info(tmp_path, epoch=1, results=columns)) == 2
    assert (fresh / "results.csv").read_text() == "epoch,time,train/box_loss\n1,1.5,0.9\n2,2.5,0.8\n"
    # Without train_results in the checkpoint: the csv beside the checkpoint.
    old = tmp_path / "old"
    (old / "weights").mkdir(parents=True)
    (old / "results.csv").write_text(f"{HEADER}\n1,1,1,0\n2,2,2,0\n3,3,3,0\n")
    other = tmp_path / "other" / "train"
    assert prepare_results_csv(other, info(tmp_path, epoch=2)) == 3


def test_termination_message_files(tmp_path, monkeypatch):
    k8s = tmp_path / "termination-log"
    k8s.write_text("")
    monkeypatch.setenv("TERMINATION_LOG", str(k8s))
    message = termination_message(
        run_id="r1",
        status="checkpointed",
        exit_code=75,
        checkpoint=Path("/x/last.pt"),
        epoch=2,
        epochs=5,
        stopped_in_epoch=3,
        reason="signal SIGTERM",
    )
    write_termination(message, tmp_path / "out")
    written = (tmp_path / "out" / "termination.json").read_text()
    assert written.count("\n") == 1 and json.loads(written) == message
    assert json.loads(k8s.read_text())["checkpoint"] == "/x/last.pt"
    monkeypatch.setenv("TERMINATION_LOG", str(tmp_path / "absent"))
    write_termination(message, None)
    assert not (tmp_path / "absent").exists()  # never created outside Kubernetes


def test_manifest_lists_existing_files_with_checksums(tmp_path):
    out = tmp_path / "out"
    (out / "train" / "weights").mkdir(parents=True)
    best = out / "train" / "weights" / "best.pt"
    best.write_bytes(b"weights")
    path, artifacts = write_manifest("r1", out, [(best, "weights"), (out / "train" / "missing.onnx", "export")])
    assert artifacts == [
        {
            "name": "best.pt",
            "kind": "weights",
            "path": "train/weights/best.pt",
            "size": 7,
            "sha256": sha256_of(best),
        }
    ]
    assert json.loads(path.read_text())["artifacts"] == artifacts


# --- the demo dataset -----------------------------------------------------------------------------


def test_demo_dataset_is_deterministic_and_well_formed(tmp_path):
    pytest.importorskip("numpy")
    pytest.importorskip("PIL")
    from PIL import Image

    from training.runner.dataset import CLASS_NAMES, make_demo_dataset

    first = make_demo_dataset(tmp_path / "a", train_images=3, val_images=2, imgsz=48, seed=7)
    second = make_demo_dataset(tmp_path / "b", train_images=3, val_images=2, imgsz=48, seed=7)
    other = make_demo_dataset(tmp_path / "c", train_images=3, val_images=2, imgsz=48, seed=8)

    def contents(data_yaml: Path) -> dict[str, bytes]:
        root = data_yaml.parent
        return {
            str(p.relative_to(root)): p.read_bytes()
            for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "data.yaml"
        }

    assert contents(first) == contents(second) != contents(other)
    assert len(list((first.parent / "images" / "train").glob("*.png"))) == 3
    text = first.read_text()
    assert f"path: {first.parent}" in text and "train: images/train" in text
    for name in CLASS_NAMES:
        assert name in text
    for label in (first.parent / "labels").rglob("*.txt"):
        for line in label.read_text().splitlines():
            cls, *box = line.split()
            assert 0 <= int(cls) < len(CLASS_NAMES)
            assert all(0 <= float(v) <= 1 for v in box)
    with Image.open(next((first.parent / "images" / "val").glob("*.png"))) as image:
        assert image.size == (48, 48)


# --- failure reasons ---------------------------------------------------------------------------


class OutOfMemoryError(RuntimeError):  # the name torch.cuda uses
    pass


@pytest.mark.parametrize(
    ("phase", "exc", "error", "words"),
    [
        (
            "training",
            OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"),
            "out_of_memory",
            "lower batch or imgsz",
        ),
        ("training", RuntimeError("CUDA error: out of memory"), "out_of_memory", "batch=4, imgsz=64"),
        (
            "data",
            FileNotFoundError("Dataset '/d.yaml' error \x1b[31m❌ images not found\x1b[0m"),
            "data",
            "cannot be used: images not found",
        ),
        ("model", KeyError("backbone"), "model", "cannot be loaded or built"),
        ("trainer", ValueError("Invalid CUDA 'device=3' requested."), "device", "device=3"),
        ("training", ValueError("boom\nsecond line"), "internal", "training failed: ValueError: boom second line"),
    ],
)
def test_failure_reasons_are_one_actionable_line(tmp_path, phase, exc, error, words):
    from training.runner.run import Runner
    from training.runner.spec import parse_spec

    data = tmp_path / "d.yaml"
    data.write_text("names: {0: a}\n")
    spec = parse_spec(
        {
            "run_id": "r",
            "model": "yolov8n.yaml",
            "data": str(data),
            "epochs": 1,
            "imgsz": 64,
            "batch": 4,
            "device": "cpu",
            "output_dir": str(tmp_path / "out"),
        }
    )
    runner = Runner(spec, io.StringIO())
    runner.phase = phase
    kind, reason = runner._classify(exc)
    assert kind == error and words in reason
    assert "\n" not in reason and "\x1b" not in reason


def test_watchdog_end_writes_a_forced_termination(tmp_path, monkeypatch):
    from training.runner import run as run_module
    from training.runner.spec import parse_spec

    data = tmp_path / "d.yaml"
    data.write_text("names: {0: a}\n")
    spec = parse_spec(
        {
            "run_id": "r",
            "model": "yolov8n.yaml",
            "data": str(data),
            "epochs": 5,
            "imgsz": 64,
            "batch": 4,
            "device": "cpu",
            "output_dir": str(tmp_path / "out"),
            "must_end_by": "2026-01-01T00:00:00Z",
        }
    )
    out = io.StringIO()
    runner = run_module.Runner(spec, out)
    runner.events = Events("r", out)
    runner.stop.checkpoint, runner.stop.checkpoint_epoch = tmp_path / "last.pt", 3
    exits = []
    monkeypatch.setattr(run_module.os, "_exit", exits.append)
    thread = threading.Thread(target=runner._deadline_passed)  # as the watchdog thread does
    thread.start()
    thread.join(5)
    assert exits == [exitcodes.EXIT_CHECKPOINTED]
    message = json.loads((tmp_path / "out" / "termination.json").read_text())
    assert message["forced"] is True and message["epoch"] == 3
    assert message["checkpoint"] == str(tmp_path / "last.pt")
    assert json.loads(out.getvalue().splitlines()[-1])["event"] == "checkpointed"


def test_failed_export_is_reported_and_the_run_still_succeeds(tmp_path, monkeypatch):
    import sys
    import types

    from training.runner import run as run_module
    from training.runner.spec import parse_spec

    class BrokenYOLO:
        def __init__(self, weights: str) -> None:
            pass

        def export(self, **kwargs):
            raise ModuleNotFoundError("No module named 'onnx'")

    data = tmp_path / "d.yaml"
    data.write_text("names: {0: a}\n")
    spec = parse_spec(
        {
            "run_id": "r",
            "model": "yolov8n.yaml",
            "data": str(data),
            "epochs": 2,
            "imgsz": 64,
            "batch": 4,
            "device": "cpu",
            "output_dir": str(tmp_path / "out"),
        }
    )
    monkeypatch.setitem(sys.modules, "ultralytics", types.SimpleNamespace(YOLO=BrokenYOLO))
    weights = tmp_path / "out" / "train" / "weights"
    weights.mkdir(parents=True)
    (weights / "best.pt").write_bytes(b"best")
    out = io.StringIO()
    runner = run_module.Runner(spec, out)
    runner.events = Events("r", out)
    assert runner._finish() == exitcodes.EXIT_SUCCEEDED
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    export = next(event for event in events if event["event"] == "export")
    assert export["detail"]["ok"] is False and "No module named 'onnx'" in export["detail"]["error"]
    assert events[-1]["event"] == "succeeded"
    manifest = json.loads((tmp_path / "out" / "artifacts.json").read_text())
    assert [item["name"] for item in manifest["artifacts"]] == ["best.pt"]
