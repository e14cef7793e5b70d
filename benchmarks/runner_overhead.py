"""Runner overhead against plain Ultralytics, and SIGTERM-to-exit time.

Run from the repository root: ``.venv/bin/python benchmarks/runner_overhead.py``
(needs requirements-training.txt; about 3 minutes on 2 CPU cores).

1. The same tiny training (yolov8n.yaml, synthetic shapes, imgsz 64, CPU) twice per round:
   once as ``python -m training.runner`` (progress events, reports POSTed to a loopback
   server, checkpoint callbacks, manifest) and once as a plain script calling
   ``YOLO(...).train()`` and ``export(format="onnx")`` with the same arguments and the same
   offline preamble. Order alternates between rounds. Reported: the ratio of the median
   times inside ``train()`` (goal <= 1.05), of the whole process, and of the CPU time
   (user + system) used inside ``train()`` and by the whole process. On a shared machine
   the wall-clock figures move with other load (the load average is printed); the CPU-time
   ratios move less.
2. SIGTERM to a runner in the middle of training (once a batch of epoch 2 has run, no
   artificial delay), timed to process exit; median over the tries (goal <= 10 s).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from training.runner.exitcodes import EXIT_CHECKPOINTED, EXIT_SUCCEEDED  # noqa: E402

ROUNDS = 4
SIGTERM_TRIES = 3
TRAIN = {"epochs": 8, "imgsz": 64, "batch": 8, "workers": 0}

PLAIN = textwrap.dedent(
    """
    import json, os, shutil, sys, time
    from pathlib import Path
    started = time.monotonic()
    out, data, epochs, imgsz, batch, workers = sys.argv[1:7]
    cfg = Path(out) / ".yolo"
    os.environ["YOLO_OFFLINE"] = "1"
    os.environ["YOLO_CONFIG_DIR"] = str(cfg)
    (cfg / "Ultralytics").mkdir(parents=True, exist_ok=True)
    import matplotlib
    ttf = Path(matplotlib.get_data_path()) / "fonts/ttf/DejaVuSans.ttf"
    for name in ("Arial.ttf", "Arial.Unicode.ttf"):
        shutil.copyfile(ttf, cfg / "Ultralytics" / name)
    from ultralytics import YOLO, settings
    settings.update({"sync": False})
    model = YOLO("yolov8n.yaml")
    t, c = time.monotonic(), time.process_time()
    model.train(data=data, epochs=int(epochs), imgsz=int(imgsz), batch=int(batch),
                workers=int(workers), device="cpu", plots=False, save_dir=str(Path(out) / "train"),
                exist_ok=True)
    train_s, train_cpu_s = time.monotonic() - t, time.process_time() - c
    YOLO(str(Path(out) / "train/weights/best.pt")).export(format="onnx", imgsz=int(imgsz),
                                                          device="cpu")
    print(json.dumps({"train_s": train_s, "train_cpu_s": train_cpu_s}))
    """
)


def clean_env() -> dict[str, str]:
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("YOLO_", "GPUBOOK_")) and not key.lower().endswith("_proxy")
    }


def report_sink() -> tuple[str, list[int]]:
    received: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            received.append(1)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/report", received


def runner_spec(work: Path, name: str, data: Path, url: str, **changes) -> Path:
    spec = {
        "run_id": name,
        "model": "yolov8n.yaml",
        "data": str(data),
        "device": "cpu",
        "output_dir": str(work / name),
        "report_url": url,
        "report_token": "bench",
        "extra": {"plots": False},
        **TRAIN,
        **changes,
    }
    path = work / f"{name}.json"
    path.write_text(json.dumps(spec))
    return path


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_plain(work: Path, name: str, data: Path) -> tuple[float, float, float, float]:
    cpu = children_cpu_s()
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            PLAIN,
            str(work / name),
            str(data),
            *(str(TRAIN[k]) for k in ("epochs", "imgsz", "batch", "workers")),
        ],
        cwd=work,
        env=clean_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.monotonic() - started
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    return figures["train_s"], wall, children_cpu_s() - cpu, figures["train_cpu_s"]


def run_runner(spec: Path) -> tuple[float, float, float, float]:
    cpu = children_cpu_s()
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "training.runner", "--spec", str(spec)],
        cwd=REPO_ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.monotonic() - started
    if result.returncode != EXIT_SUCCEEDED:
        raise SystemExit(f"runner failed ({result.returncode}):\n{result.stderr[-3000:]}")
    last = json.loads(result.stdout.strip().splitlines()[-1])
    detail = last["detail"]
    return detail["train_s"], wall, children_cpu_s() - cpu, detail["train_cpu_s"]


def sigterm_once(spec: Path) -> dict[str, float]:
    process = subprocess.Popen(
        [sys.executable, "-m", "training.runner", "--spec", str(spec)],
        cwd=REPO_ROOT,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    sent = None
    last = {}
    for line in process.stdout:
        last = json.loads(line)
        if sent is None and last["event"] == "batch" and last["epoch"] >= 2:
            sent = time.monotonic()
            process.send_signal(signal.SIGTERM)
    code = process.wait()
    exited = time.monotonic()
    if code != EXIT_CHECKPOINTED or sent is None:
        raise SystemExit(f"expected exit {EXIT_CHECKPOINTED} after SIGTERM, got {code}")
    detail = last["detail"]
    return {
        "exit_s": exited - sent,
        "runner_stop_s": detail.get("stop_s") or 0.0,
        "save_s": detail.get("save_s") or 0.0,
    }


def main() -> None:
    from training.runner.dataset import make_demo_dataset

    url, received = report_sink()
    with tempfile.TemporaryDirectory(prefix="runner-bench-") as tmp:
        work = Path(tmp)
        data = make_demo_dataset(work / "shapes", train_images=32, val_images=8, imgsz=64, seed=0)
        print(
            f"config: yolov8n.yaml, 32+8 synthetic images, {TRAIN}, device cpu, {os.cpu_count()} CPUs; {ROUNDS} rounds"
        )
        runs: dict[str, list[tuple[float, float, float, float]]] = {"runner": [], "plain": []}
        for index in range(ROUNDS):
            spec = runner_spec(work, f"runner{index}", data, url)
            if index % 2 == 0:
                runs["plain"].append(run_plain(work, f"plain{index}", data))
                runs["runner"].append(run_runner(spec))
            else:
                runs["runner"].append(run_runner(spec))
                runs["plain"].append(run_plain(work, f"plain{index}", data))
            runner, plain = runs["runner"][-1], runs["plain"][-1]
            print(
                f"  round {index + 1}: train() runner {runner[0]:.2f} s / plain {plain[0]:.2f} s;"
                f" process {runner[1]:.2f} s / {plain[1]:.2f} s;"
                f" CPU in train() {runner[3]:.1f} s / {plain[3]:.1f} s;"
                f" CPU {runner[2]:.1f} s / {plain[2]:.1f} s;"
                f" load average {os.getloadavg()[0]:.1f}"
            )

        def ratio(column: int) -> float:
            return statistics.median(r[column] for r in runs["runner"]) / statistics.median(
                p[column] for p in runs["plain"]
            )

        print(
            f"overhead, time in train(): ratio of medians {ratio(0):.3f} "
            f"(goal <= 1.05: {'met' if ratio(0) <= 1.05 else 'NOT met'})"
        )
        print(f"overhead, whole process (import, train, ONNX export, manifest): {ratio(1):.3f}")
        print(f"overhead, CPU time in train(): {ratio(3):.3f}")
        print(f"overhead, CPU time of the whole process: {ratio(2):.3f}")
        print(f"reports received by the loopback server: {len(received)}")

        stops = []
        for index in range(SIGTERM_TRIES):
            spec = runner_spec(work, f"stop{index}", data, url, epochs=100)
            stops.append(sigterm_once(spec))
            print(
                f"  try {index + 1}: SIGTERM -> exit {stops[-1]['exit_s']:.2f} s "
                f"(runner: stop {stops[-1]['runner_stop_s']:.2f} s, "
                f"checkpoint save {stops[-1]['save_s']:.2f} s)"
            )
        median = statistics.median(stop["exit_s"] for stop in stops)
        print(
            f"SIGTERM -> exit: median {median:.2f} s, max "
            f"{max(stop['exit_s'] for stop in stops):.2f} s "
            f"(goal <= 10 s: {'met' if median <= 10 else 'NOT met'})"
        )


if __name__ == "__main__":
    main()
