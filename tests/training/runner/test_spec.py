"""Spec validation: needs only the standard library (no torch)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.training.runner.support import REPO_ROOT
from training.runner.exitcodes import EXIT_BAD_SPEC, EXIT_SUCCEEDED
from training.runner.spec import EXTRA_ARGS, RunSpec, SpecError, load_spec, parse_spec


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    data = tmp_path / "data.yaml"
    data.write_text("path: .\ntrain: a\nval: b\nnames: {0: x}\n")
    weights = tmp_path / "w.pt"
    weights.write_bytes(b"x")
    return {"data": data, "weights": weights, "out": tmp_path / "out"}


def minimal(files: dict[str, Path], **changes) -> dict:
    spec = {
        "run_id": "r1",
        "model": "yolov8n.yaml",
        "data": str(files["data"]),
        "epochs": 3,
        "imgsz": 64,
        "batch": 4,
        "device": "cpu",
        "output_dir": str(files["out"]),
    }
    spec.update(changes)
    return {key: value for key, value in spec.items() if value is not ...}


def test_minimal_spec_gets_defaults(files):
    spec = parse_spec(minimal(files))
    assert isinstance(spec, RunSpec)
    assert spec.workers == 2 and spec.grace_s == 60.0 and spec.partial_epoch == "redo"
    assert spec.export == ("onnx",) and dict(spec.extra) == {}
    assert spec.resume_from is None and spec.must_end_by is None and spec.stop_at() is None
    assert spec.ultralytics_device == "cpu"
    with pytest.raises(AttributeError):
        spec.epochs = 5  # frozen


def test_full_spec(files):
    spec = parse_spec(
        minimal(
            files,
            run_id=42,
            model=str(files["weights"]),
            device=[1],
            workers=4,
            resume_from=str(files["weights"]),
            must_end_by="2026-11-29T18:00:00+01:00",
            grace_s=30,
            report_url="https://web.example/api/runs/42/report",
            report_token="t0k",
            partial_epoch="skip",
            export=[],
            extra={"lr0": 0.02, "mosaic": 0, "cos_lr": True, "freeze": [0, 1], "amp": "bf16"},
        )
    )
    assert spec.run_id == "42" and spec.model_is_weights
    assert spec.ultralytics_device == "1"
    assert spec.must_end_by == datetime(2026, 11, 29, 17, 0, tzinfo=UTC)
    assert spec.stop_at() == spec.must_end_by.timestamp() - 30
    assert "t0k" not in repr(spec)
    assert spec.export == () and spec.extra["lr0"] == 0.02


def test_relative_paths_resolve_against_cwd(files, tmp_path):
    spec = parse_spec(minimal(files, data="data.yaml", output_dir="out"), cwd=tmp_path)
    assert spec.data == tmp_path / "data.yaml" and spec.output_dir == tmp_path / "out"


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"run_id": ...}, "run_id", "missing"),
        ({"run_id": "a b"}, "run_id", "letters"),
        ({"epochs": 0}, "epochs", "integer from 1"),
        ({"epochs": 2.5}, "epochs", "integer"),
        ({"epochs": True}, "epochs", "integer"),
        ({"imgsz": 16}, "imgsz", "32"),
        ({"batch": 0}, "batch", "AutoBatch"),
        ({"device": "cuda"}, "device", '"cpu" or'),
        ({"device": []}, "device", "non-empty"),
        ({"device": [0, 0]}, "device", "distinct"),
        ({"workers": -1}, "workers", "integer"),
        ({"data": "/nowhere/data.yaml"}, "data", "file not found: /nowhere/data.yaml"),
        ({"data": "https://x/data.yaml"}, "data", "no downloads"),
        ({"model": "yolov8n.pt"}, "model", "weights file not found"),
        ({"model": "/x/custom.yaml"}, "model", "model YAML not found"),
        ({"model": "resnet"}, "model", ".yaml"),
        ({"resume_from": "/nowhere/last.pt"}, "resume_from", "file not found"),
        ({"must_end_by": "2026-11-29T18:00:00"}, "must_end_by", "zone"),
        ({"must_end_by": "tomorrow"}, "must_end_by", "ISO-8601"),
        ({"grace_s": -1}, "grace_s", ">= 0"),
        ({"report_url": "ftp://x/y", "report_token": "t"}, "report_url", "http(s)"),
        ({"report_url": "http://x/y"}, "report_token", "required"),
        ({"report_token": "t"}, "report_token", "without report_url"),
        ({"partial_epoch": "later"}, "partial_epoch", "redo, skip"),
        ({"export": ["onnx", "pdf"]}, "export", "onnx"),
        ({"extra": {"project": "x"}}, "extra.project", "not an allowed"),
        ({"extra": {"time": 1.0}}, "extra.time", "not an allowed"),
        ({"extra": {"lr0": "fast"}}, "extra.lr0", "a number"),
        ({"extra": {"pretrained": "/w.pt"}}, "extra.pretrained", "true or false"),
        ({"extra": {"optimizer": "Lion"}}, "extra.optimizer", "one of"),
        ({"epoch": 3}, "epoch", "unknown field"),
        ({"tune": 3}, "tune", "a mapping"),
        ({"tune": {"iterations": 0}}, "tune.iterations", "from 1 to 1000"),
        ({"tune": {"iterations": 2, "trials": 1}}, "tune.trials", "unknown field"),
        ({"tune": {"iterations": 2, "space": {"imgsz": [32, 64]}}}, "tune.space.imgsz", "may be tuned"),
        ({"tune": {"iterations": 2, "space": {"optimizer": [0, 1]}}}, "tune.space.optimizer", "may be tuned"),
        ({"tune": {"iterations": 2, "space": {"lr0": [0.1]}}}, "tune.space.lr0", "[low, high]"),
        ({"tune": {"iterations": 2, "space": {"lr0": [0.1, 0.01]}}}, "tune.space.lr0", "above high"),
        ({"tune": {"iterations": 2, "space": {"lr0": [0.01, 0.1, 2]}}}, "tune.space.lr0", "gain"),
        ({"tune": {"iterations": 2, "space": {"close_mosaic": [1.2, 1.8]}}}, "tune.space.close_mosaic", "holds none"),
        ({"tune": {"iterations": 2}, "device": [0, 1]}, "device", "one GPU"),
        ({"tune": {"iterations": 2}, "export": ["onnx"]}, "export", "exports nothing"),
    ],
)
def test_invalid_fields_are_named(files, changes, field, words):
    with pytest.raises(SpecError) as caught:
        parse_spec(minimal(files, **changes))
    assert caught.value.field == field
    assert words in str(caught.value)
    assert f"'{field}'" in str(caught.value)


def test_a_tune_spec_exports_nothing_and_keeps_its_space(files):
    spec = parse_spec(minimal(files, tune={"iterations": 3, "space": {"lr0": [1e-5, 0.1], "momentum": [0.6, 0.98, 0.3]}}))
    assert spec.tune.iterations == 3 and spec.export == ()
    assert spec.tune.as_json() == {"iterations": 3, "space": {"lr0": [1e-5, 0.1], "momentum": [0.6, 0.98, 0.3]}}
    assert parse_spec(minimal(files, tune={"iterations": 1})).tune.space is None
    assert parse_spec(minimal(files)).tune is None


def test_builtin_model_names(files):
    pytest.importorskip("ultralytics")
    for name in ("yolov8n.yaml", "yolov8x.yaml", "yolo11n.yaml", "yolov10l.yaml"):
        assert parse_spec(minimal(files, model=name)).model == name
    with pytest.raises(SpecError, match="not a model config"):
        parse_spec(minimal(files, model="yolov99n.yaml"))


def test_every_extra_arg_is_an_ultralytics_train_arg():
    ultralytics = pytest.importorskip("ultralytics")
    import yaml

    default = Path(ultralytics.__file__).parent / "cfg" / "default.yaml"
    known = set(yaml.safe_load(default.read_text()))
    assert set(EXTRA_ARGS) <= known


def test_load_spec_reports_bad_json(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text("{not json")
    with pytest.raises(SpecError, match="not valid JSON"):
        load_spec(path)
    with pytest.raises(SpecError, match="spec file not found"):
        load_spec(tmp_path / "missing.json")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "training.runner", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_help_and_check_need_no_torch(files, tmp_path):
    result = _cli("--help")
    assert result.returncode == 0 and "--spec" in result.stdout and "75" in result.stdout
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(minimal(files, report_url="http://h/r", report_token="s3")))
    result = _cli("--spec", str(spec_path), "--check")
    assert result.returncode == EXIT_SUCCEEDED, result.stderr
    checked = json.loads(result.stdout)
    assert checked["ok"] is True and checked["spec"]["report_token"] == "***"
    assert "s3" not in result.stdout


def test_cli_bad_spec_exits_2_with_a_termination_message(files, tmp_path):
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(minimal(files, data=str(tmp_path / "gone.yaml"))))
    result = _cli("--spec", str(spec_path))
    assert result.returncode == EXIT_BAD_SPEC
    line = json.loads(result.stdout)  # exactly one line, the failed event
    assert line["event"] == "failed" and line["detail"]["error"] == "spec"
    assert "gone.yaml" in line["detail"]["reason"]
    written = json.loads((files["out"] / "termination.json").read_text())
    assert written["exit_code"] == EXIT_BAD_SPEC and written["reason"] == line["detail"]["reason"]
