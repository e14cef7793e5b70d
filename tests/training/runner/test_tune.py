"""Hyper-parameter tuning as a run, with real Ultralytics on the CPU: three iterations of one
epoch on the demo dataset, a SIGTERM in the middle of the second, and a resume that trains the
second again with the same values and then the third. Under the network audit."""

from __future__ import annotations

import hashlib
import json
import signal
import time
from datetime import UTC, datetime, timedelta

import pytest
import yaml

from tests.training.runner.support import REPORT_TOKEN, RunnerProcess, network_attempts, write_spec
from training.runner.exitcodes import EXIT_CHECKPOINTED, EXIT_SUCCEEDED

pytest.importorskip("ultralytics", reason="needs requirements-training.txt")
pytestmark = pytest.mark.training

SIGTERM_TO_EXIT_BOUND_S = 15.0
BATCH_DELAY_S = 0.3  # so that the signal lands in a training batch of the second iteration
SPACE = {"lr0": [1e-4, 1e-2], "momentum": [0.6, 0.98]}


def test_tune_checkpoints_between_iterations_and_resumes_after_a_sigterm(tmp_path, report_server, network_audit):
    from training.runner.dataset import make_demo_dataset

    data_yaml = make_demo_dataset(tmp_path / "shapes", train_images=16, val_images=8, imgsz=64, seed=3)
    out = tmp_path / "tune-run"
    spec = write_spec(
        tmp_path / "tune.json", run_id="tune", model="yolov8n.yaml", data=str(data_yaml), epochs=1, imgsz=64,
        batch=4, device="cpu", workers=0, output_dir=str(out), extra={"lr0": 0.005},
        tune={"iterations": 3, "space": SPACE}, report_url=report_server.url, report_token=REPORT_TOKEN,
    )

    # Run 1: iteration 1 finishes; a SIGTERM to the whole group in a batch of iteration 2.
    runner = RunnerProcess(spec, audit_dir=network_audit, batch_delay_s=BATCH_DELAY_S)
    first = runner.wait_for(lambda e: e["event"] == "iteration", timeout=180)
    assert first["epoch"] == 1 and first["epochs"] == 3
    # The first iteration trains with the spec's own values (lr0 from extra, momentum the default).
    assert first["detail"]["hyperparameters"] == {"lr0": 0.005, "momentum": 0.937}
    assert {"fitness", "best_fitness", "best_iteration", "mAP50-95", "hyp.lr0", "hyp.momentum"} <= set(first["metrics"])
    runner.wait_for(lambda e: e["event"] == "batch", timeout=120)
    pending = json.loads((out / "tune" / "pending.json").read_text())
    assert pending["iteration"] == 2
    sent = time.monotonic()
    runner.signal(signal.SIGTERM, group=True)
    assert runner.wait(timeout=60) == EXIT_CHECKPOINTED, runner.stderr_tail()
    assert time.monotonic() - sent < SIGTERM_TO_EXIT_BOUND_S
    message = json.loads((out / "termination.json").read_text())
    assert message["status"] == "checkpointed" and message["reason"] == "signal SIGTERM"
    assert message["epoch"] == 1 and message["epochs"] == 3 and message["stopped_in_iteration"] == 2
    assert message["checkpoint"] is None  # the state is the output_dir's, not a file to resume from
    results = out / "tune" / "tune_results.ndjson"
    assert [json.loads(line)["iteration"] for line in results.read_text().splitlines()] == [1]
    assert [e["epoch"] for e in runner.of("iteration")] == [1]

    # A run whose slot is all but over (must_end_by - grace already passed) trains nothing and
    # keeps what is there, the interrupted iteration's values included.
    late = json.loads(spec.read_text())
    late.update(must_end_by=(datetime.now(UTC) + timedelta(seconds=90)).isoformat(), grace_s=120)
    runner = RunnerProcess(write_spec(tmp_path / "late.json", **late), audit_dir=network_audit)
    assert runner.wait(timeout=60) == EXIT_CHECKPOINTED, runner.stderr_tail()
    message = json.loads((out / "termination.json").read_text())
    assert message["reason"] == "must_end_by" and message["epoch"] == 1 and runner.of("started") == []
    assert json.loads((out / "tune" / "pending.json").read_text()) == pending

    # Run 2 (the same spec, as the next slot starts it): iteration 2 again, with the values it
    # had, then iteration 3.
    runner = RunnerProcess(spec, audit_dir=network_audit)
    assert runner.wait(timeout=240) == EXIT_SUCCEEDED, runner.stderr_tail()
    iterations = runner.of("iteration")
    assert [e["epoch"] for e in iterations] == [2, 3]
    assert iterations[0]["detail"]["hyperparameters"] == pending["hyperparameters"]
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["iteration"] for r in records] == [1, 2, 3]
    for record in records:
        assert set(record["hyperparameters"]) == set(SPACE)
        for key, (low, high) in SPACE.items():
            assert low <= record["hyperparameters"][key] <= high
    assert not (out / "tune" / "pending.json").exists()

    # The best: Ultralytics' choice (the first of the highest fitness), its values and weights.
    best = max(records, key=lambda r: (r["fitness"], -r["iteration"]))
    message = json.loads((out / "termination.json").read_text())
    assert message["status"] == "succeeded" and message["epoch"] == 3
    assert message["best_iteration"] == best["iteration"]
    assert message["best_hyperparameters"] == best["hyperparameters"]
    assert message["optimizer"] == "AdamW"
    best_file = yaml.safe_load((out / "tune" / "best_hyperparameters.yaml").read_text())
    assert best_file == best["hyperparameters"]
    assert [p.name for p in (out / "tune").glob("iter*")] == [f"iter{best['iteration']}"]
    listed = {item["name"]: item for item in json.loads((out / "artifacts.json").read_text())["artifacts"]}
    assert set(listed) == {"best.pt", "best_hyperparameters.yaml", "tune_results.ndjson"}
    weights = out / "tune" / "weights" / "best.pt"
    assert listed["best.pt"]["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()

    # Every finished iteration reached the web app once, across both runs.
    assert report_server.rejected == []
    reported = [body for body in report_server.bodies if body["event"] == "iteration"]
    assert [body["epoch"] for body in reported] == [1, 2, 3]
    assert [body["metrics"]["hyp.lr0"] for body in reported] == [r["hyperparameters"]["lr0"] for r in records]

    # Started again after success: nothing is trained again.
    runner = RunnerProcess(spec, audit_dir=network_audit)
    assert runner.wait(timeout=120) == EXIT_SUCCEEDED, runner.stderr_tail()
    assert runner.of("started") == [] and runner.of("iteration") == []

    assert network_attempts(network_audit) == []
