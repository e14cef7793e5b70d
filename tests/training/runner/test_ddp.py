"""Several GPUs for one run (training/runner/ddp.py).

The commands and rules are unit-tested; the signal path is tested on the CPU with a stand-in
DDP worker (ddp_standin.py: a real torch.distributed gloo training under the same launcher,
process groups, signal handling and stop agreement as the runner's workers). The real
two-GPU Ultralytics case is benchmarks/gpu_check.sh, for a CUDA machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from training.runner import ddp
from training.runner.spec import parse_spec

REPO_ROOT = Path(__file__).resolve().parents[3]


# --- the command and the rules -----------------------------------------------------------------


def test_worker_commands_carry_the_torch_distributed_environment(tmp_path):
    spec = tmp_path / "spec.json"
    commands = ddp.worker_commands(spec, 2, master_port=29123, base_env={"CUDA_VISIBLE_DEVICES": "2,3", "HOME": "/h"},
                                   python="/venv/bin/python")
    assert [c.rank for c in commands] == [0, 1]
    assert commands[1].argv == ("/venv/bin/python", "-m", "training.runner", "--spec", str(spec), "--ddp-rank", "1")
    env = commands[1].env
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")} == {
        "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29123",
    }
    # The executor's GPU pinning is left alone: each worker sees the run's GPUs, picks device[LOCAL_RANK].
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["HOME"] == "/h"
    with pytest.raises(ValueError):
        ddp.worker_commands(spec, 1, master_port=1, base_env={})


def test_what_ultralytics_is_given_in_a_worker(tmp_path):
    """Each worker trains with device "0,1": Ultralytics' world size 2, and with LOCAL_RANK set
    it sets up its DDP share itself (trainer._setup_ddp) instead of launching again."""
    from training.runner.run import Runner

    data = tmp_path / "data.yaml"
    data.write_text("path: /x\n")
    spec = parse_spec({"run_id": "7", "model": "yolov8n.yaml", "data": str(data), "epochs": 3, "imgsz": 64,
                       "batch": 32, "device": [0, 1], "output_dir": str(tmp_path / "out"),
                       "extra": {"save_period": 10}})
    assert spec.gpu_count == 2 and spec.ultralytics_device == "0,1"
    args = Runner(spec, sys.stdout, ddp_rank=1)._train_args(resume=False)
    assert args["device"] == "0,1" and args["batch"] == 32 and args["save_period"] == 10
    assert Runner(spec, sys.stdout, ddp_rank=1).rank == 1


@pytest.mark.parametrize(
    ("device", "count"), [("0,1", 2), ("0", 1), (0, 1), ([0, 1, 2], 3), ("cpu", 0), (None, None), ("[0, 1]", 2)]
)
def test_device_count(device, count):
    assert ddp.device_count(device) == count


def test_resume_on_another_gpu_count_is_refused_in_words_unless_allowed():
    refusal = ddp.gpu_count_refusal(2, 1, allowed=False)
    assert refusal.startswith("the checkpoint was trained on 2 GPU(s) and this run has 1")
    assert "allow_gpu_count_change: true" in refusal
    assert ddp.gpu_count_refusal(2, 1, allowed=True) is None
    assert ddp.gpu_count_refusal(2, 2, allowed=False) is None
    assert ddp.gpu_count_refusal(0, 1, allowed=False) is None  # CPU and one GPU: the same global batch
    assert ddp.gpu_count_refusal(None, 4, allowed=False) is None


def test_overall_exit_code():
    assert ddp.overall_exit_code([75, 75]) == 75
    assert ddp.overall_exit_code([0, 0]) == 0
    assert ddp.overall_exit_code([75, 0]) == 75
    assert ddp.overall_exit_code([0, 1]) == 1
    assert ddp.overall_exit_code([2, -9]) == 2
    assert ddp.overall_exit_code([-15, 1, 1]) == 1
    assert ddp.overall_exit_code([-9, 75]) == 1


def test_a_worker_ends_with_its_own_code_and_what_it_wrote_skipping_teardown():
    """exit_worker keeps the code and the buffered output but runs no teardown: the teardown is
    where a rank that had already checkpointed was seen to abort (-6) under load."""
    script = (
        "import atexit, sys\n"
        "from training.runner.ddp import exit_worker\n"
        "atexit.register(lambda: print('teardown ran', file=sys.stderr, flush=True))\n"
        "sys.stdout.write('written, not flushed')\n"
        "exit_worker(75)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (75, "written, not flushed")
    assert "teardown ran" not in done.stderr


def test_the_runner_ends_a_ddp_worker_through_exit_worker(tmp_path):
    """cli.main, the real caller: a worker (``--ddp-rank``) that fails early (its output_dir
    cannot be made) still ends through exit_worker: its code, and no interpreter teardown."""
    data = tmp_path / "data.yaml"
    data.write_text("path: /x\n")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"run_id": "7", "model": "yolov8n.yaml", "data": str(data), "epochs": 1,
                                "imgsz": 64, "batch": 2, "device": [0, 1], "output_dir": str(blocker / "out")}))
    script = (
        "import atexit, sys\n"
        "from training.runner.cli import main\n"
        "atexit.register(lambda: print('teardown ran', file=sys.stderr, flush=True))\n"
        f"main(['--spec', {str(spec)!r}, '--ddp-rank', '1'])\n"
        "print('main returned', file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "cannot create output_dir" in done.stderr
    assert "teardown ran" not in done.stderr and "main returned" not in done.stderr


# --- the stand-in DDP training on gloo -----------------------------------------------------------

standin_only = pytest.mark.training  # needs torch (requirements-training.txt)


def launch(tmp_path: Path, world_size: int, **spec) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "run"
    out.mkdir(exist_ok=True)
    for stale in out.glob("rank*.json"):
        stale.unlink()
    for stale in ("launcher.json", "codes.json", "refused.txt"):
        (out / stale).unlink(missing_ok=True)
    spec_path = tmp_path / f"spec-{world_size}.json"
    spec_path.write_text(json.dumps({"output_dir": str(out), "world_size": world_size, "epochs": 4, "batches": 6,
                                     "batch_delay_s": 0.0, **spec}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_"))}
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.training.runner.ddp_standin", "--spec", str(spec_path), "--launch"],
        cwd=REPO_ROOT, env=env, start_new_session=True,  # its own group, as the local executor starts a run
    )
    return process, out


def wait_for_file(path: Path, process: subprocess.Popen, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file():
            try:
                return json.loads(path.read_text())
            except ValueError:
                pass  # being written
        assert process.poll() is None, f"launcher exited with {process.returncode} before {path.name}"
        time.sleep(0.05)
    process.kill()
    pytest.fail(f"{path} did not appear within {timeout} s")


def ranks(out: Path, world_size: int) -> list[dict]:
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(world_size)]


def wait_until_training(out: Path, process: subprocess.Popen, timeout: float = 60.0) -> None:
    """Until rank 0 has finished its first epoch (last.pt written)."""
    deadline = time.monotonic() + timeout
    while not (out / "last.pt").is_file():
        assert process.poll() is None, f"launcher exited with {process.returncode}"
        assert time.monotonic() < deadline, "the stand-in never finished an epoch"
        time.sleep(0.05)


@standin_only
@pytest.mark.parametrize("target", ["group", "launcher"])
def test_sigterm_reaches_every_worker_once_rank0_saves_and_all_exit_75_then_resume(tmp_path, target):
    """``group``: kill -TERM -PGID (the local executor); ``launcher``: the launcher alone (the
    kubelet's SIGTERM to PID 1). Either way every rank stops at the same batch on its own
    signal, rank 0 alone writes the resumable checkpoint, and a new launch on the same number
    of workers resumes after it and finishes; a launch on another number is refused in words."""
    pytest.importorskip("torch")
    process, out = launch(tmp_path, 2, batch_delay_s=0.15)
    launcher = wait_for_file(out / "launcher.json", process)
    wait_until_training(out, process)
    time.sleep(0.3)  # into the second epoch, most often mid-epoch
    workers = launcher["workers"]
    assert all(os.getpgid(pid) == pid for pid in workers)  # each in its own session: signals come through us

    if target == "group":
        os.killpg(process.pid, signal.SIGTERM)
    else:
        os.kill(process.pid, signal.SIGTERM)
    launcher_code = process.wait(timeout=60)
    codes = json.loads((out / "codes.json").read_text())
    assert codes["codes"] == [75, 75]  # before the launcher's code: this says which rank failed
    assert launcher_code == 75
    assert sorted(codes["forwarded"].values()) == [1, 1]  # one SIGTERM each, never two
    first = ranks(out, 2)
    assert [r["exit"] for r in first] == [75, 75]
    # Each rank stopped on its own signal, or on a peer's a collective earlier (then its own
    # arrived while it was leaving, and was not taken for a second signal).
    assert {r["reason"] for r in first} <= {"signal SIGTERM", "a peer rank was asked to stop"}
    assert first[0]["stopped_in_epoch"] == first[1]["stopped_in_epoch"]  # the same batch, by agreement
    import torch

    checkpoint = torch.load(out / "last.pt", map_location="cpu")
    if first[0]["stopped_in_epoch"] is not None:  # mid-epoch: "skip" counts the epoch done
        stopped_epoch = first[0]["stopped_in_epoch"] - 1
    else:  # at an epoch start: the previous epoch's checkpoint stands
        stopped_epoch = first[0]["saves"][-1]
    assert checkpoint["world_size"] == 2 and checkpoint["epoch"] == stopped_epoch < 3
    assert first[0]["saves"][-1] == stopped_epoch and first[1]["saves"] == []  # rank 0 alone saves

    if target == "launcher":
        return  # the resume below is the same for both; run it once (CI time)

    # Another number of workers: refused in words by the launcher, no worker started.
    refused, _ = launch(tmp_path, 3)
    assert refused.wait(timeout=60) == 1
    assert (out / "refused.txt").read_text() == ddp.gpu_count_refusal(2, 3, allowed=False)
    assert not list(out.glob("rank*.json")) and not (out / "launcher.json").exists()
    assert torch.load(out / "last.pt", map_location="cpu")["epoch"] == stopped_epoch

    # The same number: resumes after the checkpoint and finishes.
    resumed, _ = launch(tmp_path, 2)
    assert resumed.wait(timeout=90) == 0
    second = ranks(out, 2)
    assert [r["exit"] for r in second] == [0, 0]
    assert {r["start_epoch"] for r in second} == {stopped_epoch + 1}
    assert torch.load(out / "last.pt", map_location="cpu")["epoch"] == 3


@standin_only
def test_a_failed_worker_stops_its_peers_instead_of_leaving_them_hanging(tmp_path):
    pytest.importorskip("torch")
    process, out = launch(tmp_path, 2, batch_delay_s=0.15)
    launcher = wait_for_file(out / "launcher.json", process)
    wait_until_training(out, process)
    os.kill(launcher["workers"][1], signal.SIGKILL)  # rank 1 dies without a word
    assert process.wait(timeout=60) != 0
    codes = json.loads((out / "codes.json").read_text())["codes"]
    assert codes[1] == -signal.SIGKILL and codes[0] != 0  # rank 0 was stopped, not left in a collective


@standin_only
def test_the_runner_launches_one_worker_per_gpu_and_rank0_speaks_for_the_run(tmp_path):
    """The real launcher path of `python -m training.runner` for a two-GPU spec, on this
    CPU-only machine: both workers start (rank 0 with the launcher's stdout), each finds no
    CUDA device, and the run ends once, in rank 0's words, with the launcher's exit code."""
    pytest.importorskip("ultralytics")
    data = tmp_path / "data.yaml"
    data.write_text("path: /x\ntrain: images\nval: images\nnames: {0: a}\n")
    out = tmp_path / "out"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"run_id": "ddp", "model": "yolov8n.yaml", "data": str(data), "epochs": 1,
                                "imgsz": 64, "batch": 4, "device": [0, 1], "output_dir": str(out)}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_"))}
    env["CUDA_VISIBLE_DEVICES"] = ""
    done = subprocess.run([sys.executable, "-m", "training.runner", "--spec", str(spec)], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 1, done.stderr[-2000:]
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert [event["event"] for event in events] == ["failed"]  # rank 0's one end; rank 1 says nothing
    message = json.loads((out / "termination.json").read_text())
    assert message["error"] == "device" and "0 CUDA device(s) are visible" in message["reason"]
    assert "gpubook-runner rank 1: failed" in done.stderr  # rank 1 ran, and ended quietly
    assert not list(out.glob(".ddp-spec-*"))  # the workers' spec copy (it holds the token) is removed
