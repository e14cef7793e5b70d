"""Export formats from the spec: each export is an artifact with its checksum, and the ONNX,
TorchScript and OpenVINO files load back and run on one image (onnxruntime / torch.jit /
the OpenVINO runtime, from the zipped folder as a user downloads it)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.training.runner.support import RunnerProcess, network_attempts, write_spec
from training.runner.exitcodes import EXIT_SUCCEEDED
from training.runner.run import ENGINE_NEEDS_CUDA

pytest.importorskip("ultralytics", reason="needs requirements-training.txt")
pytestmark = pytest.mark.training


def _image_tensor(data_yaml: Path, imgsz: int):
    """One validation image as the 1x3xHxW float tensor (RGB, 0..1) the exports take."""
    import numpy as np
    from PIL import Image

    image_path = sorted((data_yaml.parent / "images" / "val").iterdir())[0]
    image = Image.open(image_path).convert("RGB").resize((imgsz, imgsz))
    return np.ascontiguousarray(np.asarray(image, dtype=np.float32).transpose(2, 0, 1)[None] / 255.0)


def test_onnx_torchscript_and_openvino_exports_run_and_engine_is_refused_on_cpu(tmp_path, network_audit):
    from training.runner.dataset import CLASS_NAMES, make_demo_dataset

    data_yaml = make_demo_dataset(tmp_path / "shapes", train_images=8, val_images=4, imgsz=64, seed=5)
    out = tmp_path / "exp"
    spec = write_spec(
        tmp_path / "exp.json", run_id="exp", model="yolov8n.yaml", data=str(data_yaml), epochs=1, imgsz=64,
        batch=4, device="cpu", workers=0, output_dir=str(out), extra={"plots": False},
        export=["onnx", "torchscript", "openvino", "engine"],
    )
    runner = RunnerProcess(spec, audit_dir=network_audit)
    assert runner.wait(timeout=240) == EXIT_SUCCEEDED, runner.stderr_tail()

    exports = {event["detail"]["format"]: event["detail"] for event in runner.of("export")}
    assert exports["onnx"]["ok"] and exports["torchscript"]["ok"] and exports["openvino"]["ok"]
    assert exports["engine"] == {"format": "engine", "ok": False, "error": ENGINE_NEEDS_CUDA}

    weights = out / "train" / "weights"
    listed = {item["name"]: item for item in json.loads((out / "artifacts.json").read_text())["artifacts"]}
    for name in ("best.onnx", "best.torchscript", "best_openvino_model.zip"):
        item = listed[name]
        assert item["kind"] == "export" and item["path"] == f"train/weights/{name}"
        assert item["sha256"] == hashlib.sha256((weights / name).read_bytes()).hexdigest()
    assert not any(name.endswith(".engine") for name in listed)

    # Loaded back outside Ultralytics, each runs on one real image: 4 box values plus one score
    # per class for every anchor of a 64-px input (8x8 + 4x4 + 2x2 = 84).
    image = _image_tensor(data_yaml, 64)
    import onnxruntime

    session = onnxruntime.InferenceSession(str(weights / "best.onnx"), providers=["CPUExecutionProvider"])
    (onnx_out,) = session.run(None, {session.get_inputs()[0].name: image})
    assert onnx_out.shape == (1, 4 + len(CLASS_NAMES), 84)

    import torch

    module = torch.jit.load(str(weights / "best.torchscript"), map_location="cpu")
    with torch.no_grad():
        script_out = module(torch.from_numpy(image))
    script_out = script_out[0] if isinstance(script_out, list | tuple) else script_out
    assert tuple(script_out.shape) == onnx_out.shape
    # The same weights behind both: the two runtimes agree on the boxes and scores.
    assert abs(script_out.numpy() - onnx_out).max() < 1e-2

    # OpenVINO: one artifact, the zipped model folder; unzipped and compiled for the CPU.
    import zipfile

    import openvino

    with zipfile.ZipFile(weights / "best_openvino_model.zip") as archive:
        assert sorted(archive.namelist()) == [
            "best_openvino_model/best.bin", "best_openvino_model/best.xml", "best_openvino_model/metadata.yaml",
        ]
        archive.extractall(tmp_path / "unzipped")
    # f32: the CPU plugin may otherwise compute in bf16/f16, and the comparison is of the weights.
    compiled = openvino.Core().compile_model(
        str(tmp_path / "unzipped" / "best_openvino_model" / "best.xml"), "CPU", {"INFERENCE_PRECISION_HINT": "f32"}
    )
    openvino_out = compiled(image)[compiled.output(0)]
    assert openvino_out.shape == onnx_out.shape
    assert abs(openvino_out - onnx_out).max() < 1e-2

    assert network_attempts(network_audit) == []
