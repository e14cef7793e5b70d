"""The runner with real Ultralytics on the CPU, on a tiny synthetic dataset made here.

Every runner child runs with an audit hook that records any DNS lookup or connect to a
non-loopback address; each test asserts there was none.
"""

from __future__ import annotations

import hashlib
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.training.runner.support import (
    REPORT_TOKEN,
    RunnerProcess,
    network_attempts,
    write_spec,
)
from training.runner.checkpoints import read_results_epochs
from training.runner.exitcodes import EXIT_CHECKPOINTED, EXIT_FAILED, EXIT_SUCCEEDED

pytest.importorskip("ultralytics", reason="needs requirements-training.txt")
pytestmark = pytest.mark.training

SIGTERM_TO_EXIT_BOUND_S = 15.0  # the goal is 10 s on this config; measured ~2 s
BATCH_DELAY_S = 0.3  # so that a signal lands in the middle of an epoch


@pytest.fixture(scope="module")
def data_yaml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from training.runner.dataset import make_demo_dataset

    return make_demo_dataset(tmp_path_factory.mktemp("shapes"), train_images=16, val_images=8, imgsz=64, seed=3)


def tiny_spec(tmp_path: Path, data_yaml: Path, name: str, **fields) -> Path:
    spec = {
        "run_id": name,
        "model": "yolov8n.yaml",
        "data": str(data_yaml),
        "epochs": 3,
        "imgsz": 64,
        "batch": 4,
        "device": "cpu",
        "workers": 0,
        "output_dir": str(tmp_path / name),
        "extra": {"plots": False},
        **fields,
    }
    return write_spec(tmp_path / f"{name}.json", **spec)


def termination(output_dir: Path) -> dict:
    return json.loads((output_dir / "termination.json").read_text())


def test_trains_exports_and_reports(tmp_path, data_yaml, report_server, network_audit):
    spec = tiny_spec(
        tmp_path,
        data_yaml,
        "full",
        report_url=report_server.url,
        report_token=REPORT_TOKEN,
    )
    runner = RunnerProcess(spec, audit_dir=network_audit)
    assert runner.wait(timeout=180) == EXIT_SUCCEEDED, runner.stderr_tail()
    out = tmp_path / "full"

    # Progress lines: every stdout line is one event of the documented shape.
    assert len(runner.raw_lines) == len(runner.events)
    for event in runner.events:
        assert set(event) == {"run_id", "event", "epoch", "epochs", "metrics", "time", "detail"}
        assert event["run_id"] == "full" and event["epochs"] == 3
        assert all(isinstance(v, int | float) for v in event["metrics"].values())
        assert event["time"].endswith("Z")
    kinds = [event["event"] for event in runner.events]
    assert kinds[0] == "started" and kinds[-1] == "succeeded"
    assert [event["epoch"] for event in runner.of("epoch")] == [1, 2, 3]
    last_epoch = runner.of("epoch")[-1]["metrics"]
    for name in ("box_loss", "cls_loss", "dfl_loss", "mAP50", "mAP50-95", "lr", "elapsed_s", "eta_s"):
        assert name in last_epoch
    batch = runner.of("batch")[0]["metrics"]
    assert {"batch", "batches", "box_loss", "lr", "elapsed_s", "eta_s"} <= set(batch)
    assert "final" in kinds and "artifacts" in kinds

    # Artifacts and their manifest.
    weights = out / "train" / "weights"
    for name in ("best.pt", "last.pt", "best.onnx"):
        assert (weights / name).is_file(), name
    assert read_results_epochs(out / "train" / "results.csv") == [1, 2, 3]
    manifest = json.loads((out / "artifacts.json").read_text())
    listed = {item["name"]: item for item in manifest["artifacts"]}
    assert {"best.pt", "last.pt", "best.onnx", "results.csv"} <= set(listed)
    onnx = listed["best.onnx"]
    assert onnx["kind"] == "export" and onnx["path"] == "train/weights/best.onnx"
    assert onnx["size"] == (weights / "best.onnx").stat().st_size
    assert onnx["sha256"] == hashlib.sha256((weights / "best.onnx").read_bytes()).hexdigest()
    export = runner.of("export")[0]["detail"]
    assert export["ok"] is True and export["format"] == "onnx"

    message = termination(out)
    assert message["status"] == "succeeded" and message["exit_code"] == 0
    assert message["epoch"] == 3 and message["manifest"] == str(out / "artifacts.json")
    assert runner.events[-1]["detail"] == message

    # The reports reached the web app with the run's token, in the same shape.
    assert report_server.rejected == []
    reported = report_server.events()
    assert reported[0] == "started" and reported[-1] == "succeeded"
    assert reported.count("epoch") == 3 and "artifacts" in reported
    assert report_server.bodies[-1] == runner.events[-1]

    assert network_attempts(network_audit) == []


def test_sigterm_checkpoints_and_resume_continues(tmp_path, data_yaml, network_audit):
    """Two stop/resume cycles, the first by a SIGTERM to the whole process group with
    DataLoader workers running, then a resume into a new output_dir; results.csv ends
    with every epoch once, in order."""
    first = tiny_spec(tmp_path, data_yaml, "cycle", epochs=4, workers=2)

    # Cycle 1: group SIGTERM once a batch of epoch 2 has run.
    runner = RunnerProcess(first, audit_dir=network_audit, batch_delay_s=BATCH_DELAY_S)
    started = runner.wait_for(lambda e: e["event"] == "started", timeout=120)
    assert started["detail"]["workers"] == 2
    runner.wait_for(lambda e: e["event"] == "batch" and e["epoch"] >= 2, timeout=120)
    sent = time.monotonic()
    runner.signal(group=True)
    assert runner.wait(timeout=60) == EXIT_CHECKPOINTED, runner.stderr_tail()
    assert time.monotonic() - sent < SIGTERM_TO_EXIT_BOUND_S
    assert "DataLoader worker" not in runner.stderr_tail(20000)
    message = termination(tmp_path / "cycle")
    checkpoint = Path(message["checkpoint"])
    assert message["status"] == "checkpointed" and message["exit_code"] == EXIT_CHECKPOINTED
    assert message["reason"] == "signal SIGTERM"
    assert checkpoint == tmp_path / "cycle" / "train" / "weights" / "last.pt"
    stopped_in = message["stopped_in_epoch"]
    assert stopped_in >= 2
    assert message["epoch"] == stopped_in - 1  # "redo": the interrupted epoch runs again
    assert runner.events[-1]["event"] == "checkpointed"
    assert "final" not in [event["event"] for event in runner.events]

    # Cycle 2: same output_dir (found by itself), SIGTERM to the process only.
    runner = RunnerProcess(first, audit_dir=network_audit, batch_delay_s=BATCH_DELAY_S)
    started = runner.wait_for(lambda e: e["event"] == "started", timeout=120)
    assert started["epoch"] == stopped_in - 1
    assert started["detail"]["resumed_from"] == str(checkpoint)
    runner.wait_for(lambda e: e["event"] == "batch" and e["epoch"] > stopped_in, timeout=120)
    sent = time.monotonic()
    runner.signal()
    assert runner.wait(timeout=60) == EXIT_CHECKPOINTED, runner.stderr_tail()
    assert time.monotonic() - sent < SIGTERM_TO_EXIT_BOUND_S
    message = termination(tmp_path / "cycle")
    done = message["epoch"]
    assert done >= stopped_in
    assert read_results_epochs(tmp_path / "cycle" / "train" / "results.csv") == list(range(1, done + 1))

    # Cycle 3: a new run (new output_dir) resumes from the previous run's checkpoint.
    second = tiny_spec(tmp_path, data_yaml, "cycle-next", epochs=4, resume_from=message["checkpoint"])
    runner = RunnerProcess(second, audit_dir=network_audit)
    assert runner.wait(timeout=180) == EXIT_SUCCEEDED, runner.stderr_tail()
    assert runner.of("started")[0]["epoch"] == done
    assert [event["epoch"] for event in runner.of("epoch")] == list(range(done + 1, 5))
    out = tmp_path / "cycle-next" / "train"
    assert read_results_epochs(out / "results.csv") == [1, 2, 3, 4]
    assert (out / "weights" / "best.onnx").is_file()

    # A run started again after success does not train again.
    runner = RunnerProcess(second, audit_dir=network_audit)
    assert runner.wait(timeout=120) == EXIT_SUCCEEDED, runner.stderr_tail()
    assert runner.of("started") == [] and runner.of("export")[0]["detail"]["reused"] is True

    assert network_attempts(network_audit) == []


def test_stops_itself_before_must_end_by(tmp_path, data_yaml, network_audit):
    grace_s = 4.0
    must_end_by = datetime.now(UTC) + timedelta(seconds=14)
    spec = tiny_spec(
        tmp_path,
        data_yaml,
        "deadline",
        epochs=200,
        must_end_by=must_end_by.isoformat().replace("+00:00", "Z"),
        grace_s=grace_s,
    )
    runner = RunnerProcess(spec, audit_dir=network_audit, batch_delay_s=0.1)
    assert runner.wait(timeout=60) == EXIT_CHECKPOINTED, runner.stderr_tail()
    ended = datetime.now(UTC)
    assert ended < must_end_by, "the run outlived must_end_by"
    message = termination(tmp_path / "deadline")
    assert message["reason"] == "must_end_by"
    assert message["status"] == "checkpointed"
    assert message.get("forced") is None  # stopped at a boundary, not by the watchdog
    assert network_attempts(network_audit) == []


def test_bad_data_yaml_fails_with_a_reason(tmp_path, network_audit):
    data = tmp_path / "broken" / "data.yaml"
    data.parent.mkdir()
    data.write_text(f"path: {data.parent}\ntrain: images/train\nval: images/val\nnames:\n  0: a\n")
    spec = tiny_spec(tmp_path, data, "bad-data")
    runner = RunnerProcess(spec, audit_dir=network_audit)
    assert runner.wait(timeout=120) == EXIT_FAILED
    message = termination(tmp_path / "bad-data")
    assert message["status"] == "failed" and message["error"] == "data"
    assert str(data) in message["reason"] and "images not found" in message["reason"]
    assert "\n" not in message["reason"] and "\x1b" not in message["reason"]
    assert runner.events[-1]["event"] == "failed"
    assert network_attempts(network_audit) == []


def test_corrupt_checkpoint_fails_with_a_reason(tmp_path, data_yaml, network_audit):
    broken = tmp_path / "last.pt"
    broken.write_bytes(b"PK\x03\x04 this is not a checkpoint" * 100)
    spec = tiny_spec(tmp_path, data_yaml, "bad-ckpt", resume_from=str(broken))
    runner = RunnerProcess(spec, audit_dir=network_audit)
    assert runner.wait(timeout=120) == EXIT_FAILED
    message = termination(tmp_path / "bad-ckpt")
    assert message["error"] == "checkpoint"
    assert str(broken) in message["reason"] and "corrupt" in message["reason"]
    assert network_attempts(network_audit) == []
