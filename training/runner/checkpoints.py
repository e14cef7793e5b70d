"""Reading checkpoints and keeping results.csv consistent across stop/resume cycles."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS_FILE = "results.csv"


class CheckpointError(Exception):
    """A checkpoint cannot be used; the message says what to do."""


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    epoch: int  # 0-based epoch recorded as done; -1 in a finished (stripped) file
    epochs: int | None  # the training's total, from its args
    has_optimizer: bool
    train_results: dict[str, list[Any]] | None
    gpus: int | None = None  # how many GPUs trained it (train_args.device); 0 on the CPU

    @property
    def resumable(self) -> bool:
        """Ultralytics' own test (``Model.train``): an epoch and optimizer state."""
        return self.epoch >= 0 and self.has_optimizer

    @property
    def completed(self) -> int:
        """Epochs done according to this checkpoint."""
        return self.epoch + 1 if self.epoch >= 0 else (self.epochs or 0)

    @property
    def all_epochs_done(self) -> bool:
        return self.epochs is not None and self.epoch + 1 >= self.epochs


def device_count(device: Any) -> int | None:
    from training.runner.ddp import device_count as count

    return count(device)


def inspect_checkpoint(path: Path) -> CheckpointInfo:
    """Load ``path`` on the CPU and describe it. Raises :class:`CheckpointError`."""
    from ultralytics.utils.patches import torch_load

    try:
        ckpt = torch_load(str(path), map_location="cpu")
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint not found: {path}") from None
    except Exception as exc:  # torch raises many kinds for a damaged file
        raise CheckpointError(
            f"checkpoint {path} is corrupt or unreadable ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}); delete it to start "
            "over, or resume from an earlier checkpoint"
        ) from exc
    if not isinstance(ckpt, dict) or not ({"ema", "model"} & set(ckpt)):
        raise CheckpointError(f"{path} is not an Ultralytics training checkpoint")
    train_args = ckpt.get("train_args") or {}
    epochs = train_args.get("epochs") if isinstance(train_args, dict) else None
    results = ckpt.get("train_results")
    return CheckpointInfo(
        path=path,
        epoch=int(ckpt.get("epoch", -1) if ckpt.get("epoch") is not None else -1),
        epochs=int(epochs) if isinstance(epochs, int) else None,
        has_optimizer=ckpt.get("optimizer") is not None,
        train_results=results if isinstance(results, dict) and results.get("epoch") else None,
        gpus=device_count(train_args.get("device")) if isinstance(train_args, dict) else None,
    )


def prepare_results_csv(save_dir: Path, info: CheckpointInfo) -> int:
    """Make ``save_dir/results.csv`` hold exactly the epochs ``info`` says are done.

    Ultralytics appends the csv row *before* writing last.pt, so a kill between the two
    leaves a row the checkpoint does not cover, and the resumed run would write that epoch
    again (recipe §4.2.3). When the run continues in a new directory, the rows come from the
    checkpoint itself, or from the csv beside it. Returns the number of rows kept.
    """
    target = save_dir / RESULTS_FILE
    header: list[str] | None = None
    rows: list[list[str]] = []
    if target.is_file():
        header, rows = _read_csv(target.read_text(encoding="utf-8"))
    elif info.train_results:
        header, rows = _from_columns(info.train_results)
    else:
        sibling = info.path.parent.parent / RESULTS_FILE
        if sibling.is_file():
            header, rows = _read_csv(sibling.read_text(encoding="utf-8"))
    if header is None or "epoch" not in header:
        return 0
    column = header.index("epoch")
    by_epoch: dict[int, list[str]] = {}
    for row in rows:
        try:
            epoch = int(float(row[column]))
        except (IndexError, ValueError):
            continue
        if 1 <= epoch <= info.completed:
            by_epoch[epoch] = row  # the last row of an epoch wins
    save_dir.mkdir(parents=True, exist_ok=True)
    out = io.StringIO()
    out.write(",".join(header) + "\n")
    for epoch in sorted(by_epoch):
        out.write(",".join(by_epoch[epoch]) + "\n")
    target.write_text(out.getvalue(), encoding="utf-8")
    return len(by_epoch)


def read_results_epochs(path: Path) -> list[int]:
    """The epoch column of a results.csv, in file order."""
    header, rows = _read_csv(path.read_text(encoding="utf-8"))
    column = header.index("epoch")
    return [int(float(row[column])) for row in rows]


def _read_csv(text: str) -> tuple[list[str], list[list[str]]]:
    reader = csv.reader(io.StringIO(text))
    lines = [[cell.strip() for cell in row] for row in reader if row]
    if not lines:
        return [], []
    return lines[0], lines[1:]


def _from_columns(columns: dict[str, list[Any]]) -> tuple[list[str], list[list[str]]]:
    header = [str(name).strip() for name in columns]
    count = min(len(values) for values in columns.values())
    rows = [
        [
            "%.6g" % value if isinstance(value, int | float) else str(value)  # noqa: UP031 (Ultralytics' format)
            for value in (columns[name][index] for name in columns)
        ]
        for index in range(count)
    ]
    return header, rows
