"""The runner on real GPUs: 1- and 2-GPU training, SIGTERM mid-epoch, resume, and exports.

For a CUDA machine with at least one NVIDIA GPU (two for the DDP part); nothing here runs on
CPU-only CI. Not yet run: no GPU was lent while it was written (issue #17), so its figures
are still to be recorded. Run from the repository root with the training requirements
installed (requirements-training.txt; TensorRT for the engine export):

    python benchmarks/gpu_check.py [--out var/gpu_check] [--epochs 4]

Each case runs ``python -m training.runner`` as the executors do, in its own process group:

1. ``one-gpu``: device [0], SIGTERM mid-epoch (to the whole group, as the local executor
   sends it) -> exit 75 with a resumable last.pt; resume -> exit 0; exports onnx,
   torchscript and engine (TensorRT) each listed in artifacts.json with its checksum.
2. ``two-gpu``: device [0, 1] (DDP, one worker per GPU launched by the runner), SIGTERM to
   the runner alone (as the kubelet sends it to PID 1) -> every worker stops at the same
   batch, rank 0 saves, exit 75; resume on two GPUs -> exit 0 and exports.
3. ``two-gpu-refused``: the two-GPU checkpoint of case 2 before its resume, resumed on one
   GPU -> refused in words (exit 1), unless allow_gpu_count_change.

It prints one JSON line per case and writes them all to ``<out>/gpu_check.json``: exit
codes, SIGTERM-to-exit seconds, checkpoint epoch, resumed start epoch, results.csv epochs,
exports and their sizes, and the GPU names. A case that cannot run (one GPU only) says so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from run_all import NOT_RUN_HERE

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BATCH_DELAY_S = "0.2"  # each train batch sleeps this long, so a signal lands mid-epoch


def gpus() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def write_spec(path: Path, **fields) -> Path:
    path.write_text(json.dumps(fields))
    return path


class Runner:
    def __init__(self, spec: Path, *, delay: bool) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if delay:
            env["GPUBOOK_RUNNER_BATCH_DELAY_S"] = BATCH_DELAY_S
        self.log = spec.with_suffix(".stderr.log").open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "training.runner", "--spec", str(spec)], cwd=REPO, env=env,
            stdout=subprocess.PIPE, stderr=self.log, text=True, start_new_session=True,
        )
        self.events: list[dict] = []

    def until(self, kind: str, timeout: float = 900) -> dict | None:
        deadline = time.monotonic() + timeout
        assert self.process.stdout is not None
        for line in self.process.stdout:
            event = json.loads(line)
            self.events.append(event)
            if event["event"] == kind:
                return event
            if time.monotonic() > deadline:
                break
        return None

    def wait(self, timeout: float = 1800) -> int:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.events.append(json.loads(line))
        return self.process.wait(timeout=timeout)


def termination(out: Path) -> dict:
    return json.loads((out / "termination.json").read_text())


def results_epochs(out: Path) -> list[int]:
    from training.runner.checkpoints import read_results_epochs

    return read_results_epochs(out / "train" / "results.csv")


def stop_mid_epoch(spec: Path, out: Path, *, whole_group: bool) -> dict:
    runner = Runner(spec, delay=True)
    # The second epoch's third batch: a checkpoint exists and the stop is mid-epoch.
    while True:
        event = runner.until("batch")
        if event is None:
            return {"error": "no batch event", "code": runner.wait()}
        if event["epoch"] >= 2 and event["metrics"].get("batch", 0) >= 3:
            break
    sent = time.monotonic()
    if whole_group:
        os.killpg(runner.process.pid, signal.SIGTERM)
    else:
        os.kill(runner.process.pid, signal.SIGTERM)
    code = runner.wait()
    message = termination(out)
    return {"code": code, "sigterm_to_exit_s": round(time.monotonic() - sent, 2), "status": message["status"],
            "checkpoint_epoch": message.get("epoch"), "stopped_in_epoch": message.get("stopped_in_epoch"),
            "save_s": message.get("save_s")}


def finish(spec: Path, out: Path) -> dict:
    runner = Runner(spec, delay=False)
    code = runner.wait()
    started = next((e for e in runner.events if e["event"] == "started"), {})
    manifest = json.loads((out / "artifacts.json").read_text()) if (out / "artifacts.json").is_file() else {}
    exports = {e["detail"]["format"]: e["detail"] for e in runner.events if e["event"] == "export"}
    return {
        "code": code, "resumed_from_epoch": started.get("epoch"), "results_epochs": results_epochs(out),
        "exports": {fmt: {"ok": d.get("ok"), "error": d.get("error")} for fmt, d in exports.items()},
        "artifacts": {a["name"]: {"size": a["size"], "sha256": a["sha256"][:12]}
                      for a in manifest.get("artifacts", [])},
        "device": started.get("detail", {}).get("device"),
    }


def case(root: Path, name: str, data: Path, device, epochs: int, *, whole_group: bool, refuse_on=None) -> dict:
    out = root / name
    shutil.rmtree(out, ignore_errors=True)
    common = dict(run_id=name, model="yolov8n.yaml", data=str(data), epochs=epochs, imgsz=320, batch=16 * len(device),
                  workers=2, output_dir=str(out), export=["onnx", "torchscript", "engine"],
                  extra={"plots": False, "save_period": 2})
    spec = write_spec(root / f"{name}.json", device=device, **common)
    record: dict = {"case": name, "device": device, "stop": stop_mid_epoch(spec, out, whole_group=whole_group)}
    if refuse_on is not None:
        refused = write_spec(root / f"{name}-refused.json", device=refuse_on, **common)
        code = Runner(refused, delay=False).wait()
        record["refused_on"] = {"device": refuse_on, "code": code, "reason": termination(out).get("reason")}
    record["resume"] = finish(spec, out)
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "var" / "gpu_check")
    parser.add_argument("--epochs", type=int, default=4)
    options = parser.parse_args()
    names = gpus()
    if not names:
        print(json.dumps({"error": "no CUDA GPU visible; this check is for a GPU machine"}))
        return NOT_RUN_HERE
    root = options.out.resolve()
    root.mkdir(parents=True, exist_ok=True)
    from training.runner.dataset import make_demo_dataset

    data = make_demo_dataset(root / "shapes", train_images=256, val_images=32, imgsz=320, seed=1)
    records = [{"gpus": names}]
    records.append(case(root, "one-gpu", data, [0], options.epochs, whole_group=True))
    if len(names) >= 2:
        records.append(case(root, "two-gpu", data, [0, 1], options.epochs, whole_group=False, refuse_on=[0]))
    else:
        records.append({"case": "two-gpu", "skipped": f"needs two GPUs; this machine has {len(names)}"})
    for record in records:
        print(json.dumps(record))
    (root / "gpu_check.json").write_text(json.dumps(records, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
