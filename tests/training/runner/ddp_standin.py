"""A stand-in DDP worker: a tiny torch.distributed (gloo) training under the runner's own DDP
launch, signal handling and stop agreement (training/runner/ddp.py), on the CPU.

``python -m tests.training.runner.ddp_standin --spec S [--ddp-rank R]``: with ``--ddp-rank`` it
is one worker (the launcher set RANK, WORLD_SIZE, MASTER_*); ``--launch`` makes it the
launcher, as ``python -m training.runner`` is for a multi-GPU spec.

The spec (JSON): output_dir, world_size, epochs, batches, batch_delay_s,
allow_gpu_count_change. Each rank writes ``rank<R>.json`` (its pid, process group, stop
reason and exit code); rank 0 writes ``last.pt`` (epoch done, world size, weights, optimizer)
at each epoch end and when stopped mid-epoch, exactly as the runner's rank 0 does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from training.runner import ddp
from training.runner.stop import Preempted

EXIT_CHECKPOINTED = 75


class Trainer:
    """The attributes GracefulStop reads and writes on an Ultralytics trainer."""

    def __init__(self, model, optimizer, output_dir: Path, epochs: int, world_size: int) -> None:
        self.model, self.optimizer = model, optimizer
        self.epoch, self.epochs = 0, epochs
        self.fitness, self.save_period = 0.0, 10
        self.last = output_dir / "last.pt"
        self.world_size = world_size
        self.device = None
        self.saves: list[int] = []

    def save_model(self) -> None:
        import torch

        torch.save({"epoch": self.epoch, "world_size": self.world_size, "model": self.model.module.state_dict(),
                    "optimizer": self.optimizer.state_dict()}, self.last)
        self.saves.append(self.epoch)


def worker(spec: dict, rank: int | None) -> int:
    import torch
    import torch.distributed as dist

    out = Path(spec["output_dir"])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = rank or 0
    record = {"rank": rank, "pid": os.getpid(), "pgid": os.getpgid(0), "world_size": world}

    def finish(code: int, **more) -> int:
        (out / f"rank{rank}.json").write_text(json.dumps({**record, "exit": code, **more}))
        return code

    stop = ddp.DistributedStop(rank=rank, stop_at=None, partial_epoch="skip").install_signal_handlers()
    start_epoch = 0
    checkpoint = None
    if (out / "last.pt").is_file():
        checkpoint = torch.load(out / "last.pt", map_location="cpu")
        refusal = ddp.gpu_count_refusal(
            checkpoint["world_size"], world, allowed=bool(spec.get("allow_gpu_count_change"))
        )
        if refusal:
            return finish(1, reason=refusal)
        start_epoch = checkpoint["epoch"] + 1
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if checkpoint is not None:
        model.module.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
    trainer = Trainer(model, optimizer, out, spec["epochs"], world)
    data = torch.randn(64, 8, generator=torch.Generator().manual_seed(rank))
    try:
        for epoch in range(start_epoch, trainer.epochs):
            trainer.epoch = epoch
            stop.on_boundary(trainer)
            for _ in range(spec["batches"]):
                optimizer.zero_grad()
                model(data).pow(2).mean().backward()  # the gradient all-reduce: a real collective
                optimizer.step()
                time.sleep(spec.get("batch_delay_s", 0))
                stop.on_train_batch_end(trainer)
            if rank == 0:
                trainer.save_model()
        code = finish(0, reason=None, start_epoch=start_epoch, saves=trainer.saves)
    except Preempted:
        code = finish(EXIT_CHECKPOINTED, reason=stop.reason, start_epoch=start_epoch, saves=trainer.saves,
                      stopped_in_epoch=stop.stopped_in_epoch)
    return code


def launch(spec_path: Path, spec: dict) -> int:
    out = Path(spec["output_dir"])
    if (out / "last.pt").is_file():  # as run_distributed: refuse before any worker starts
        import torch

        trained_on = torch.load(out / "last.pt", map_location="cpu")["world_size"]
        refusal = ddp.gpu_count_refusal(trained_on, spec["world_size"], allowed=bool(spec.get("allow_gpu_count_change")))
        if refusal:
            (out / "refused.txt").write_text(refusal)
            return 1
    commands = ddp.worker_commands(
        spec_path, spec["world_size"], master_port=ddp.free_port(), base_env=dict(os.environ),
        module="tests.training.runner.ddp_standin",
    )
    launcher = ddp.Launcher(commands, stdout0=None, kill_after_s=20).install_signal_handlers().start()
    (Path(spec["output_dir"]) / "launcher.json").write_text(json.dumps({"pid": os.getpid(), "workers": launcher.pids}))
    codes = launcher.wait()
    (Path(spec["output_dir"]) / "codes.json").write_text(json.dumps({"codes": codes, "forwarded": launcher.forwarded}))
    return ddp.overall_exit_code(codes)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--ddp-rank", type=int)
    parser.add_argument("--launch", action="store_true")
    options = parser.parse_args()
    spec = json.loads(options.spec.read_text())
    if options.launch:
        return launch(options.spec, spec)
    ddp.exit_worker(worker(spec, options.ddp_rank))  # as the runner's workers end (cli.main)


if __name__ == "__main__":
    sys.exit(main())
