"""The termination message: one JSON line saying how the run ended.

Shape (also the ``detail`` of the last progress event)::

    {
      "run_id": "42",
      "status": "checkpointed",        # "succeeded" | "checkpointed" | "failed"
      "exit_code": 75,                 # see exitcodes.py
      "checkpoint": "/runs/42/train/weights/last.pt",  # resumable checkpoint, or null
      "epoch": 2,                      # epochs completed (what the checkpoint holds)
      "epochs": 5,                     # total epochs of the training
      "stopped_in_epoch": 3,           # 1-based epoch a stop interrupted (null otherwise)
      "reason": "signal SIGTERM",      # why: signal SIGTERM/SIGINT | must_end_by | done |
                                       # a sentence a person can act on, for failures
      "error": "data",                 # failures only: spec | data | model | checkpoint |
                                       # out_of_memory | device | internal
      "time": "2026-11-29T17:02:03.123Z"
    }

Written to ``output_dir/termination.json``, to ``$TERMINATION_LOG`` (default
``/dev/termination-log``, Kubernetes' terminationMessagePath) when that file already exists
and is writable, and printed on stdout as the last progress event.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from training.runner.progress import utc_now_iso

TERMINATION_FILE = "termination.json"
_K8S_LIMIT = 4096  # Kubernetes keeps at most 4096 bytes of a termination message


def termination_message(
    *,
    run_id: str,
    status: str,
    exit_code: int,
    checkpoint: Path | None = None,
    epoch: int = 0,
    epochs: int = 0,
    stopped_in_epoch: int | None = None,
    reason: str,
    error: str | None = None,
    **more: Any,
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "run_id": run_id,
        "status": status,
        "exit_code": exit_code,
        "checkpoint": str(checkpoint) if checkpoint else None,
        "epoch": epoch,
        "epochs": epochs,
        "stopped_in_epoch": stopped_in_epoch,
        "reason": reason,
    }
    if error:
        message["error"] = error
    message.update(more)
    message["time"] = utc_now_iso()
    return message


def write_termination(message: dict[str, Any], output_dir: Path | None) -> None:
    """Write the message where executors look for it; never raises."""
    line = json.dumps(message, separators=(",", ":"), default=str)
    if output_dir is not None:
        with contextlib.suppress(OSError):
            output_dir.mkdir(parents=True, exist_ok=True)
            tmp = output_dir / (TERMINATION_FILE + ".tmp")
            tmp.write_text(line + "\n", encoding="utf-8")
            tmp.replace(output_dir / TERMINATION_FILE)
    k8s = Path(os.environ.get("TERMINATION_LOG", "/dev/termination-log"))
    if k8s.is_file() and os.access(k8s, os.W_OK):
        with contextlib.suppress(OSError):
            k8s.write_text(_fit(message, line), encoding="utf-8")


def read_termination(output_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((output_dir / TERMINATION_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _fit(message: dict[str, Any], line: str) -> str:
    if len(line.encode()) <= _K8S_LIMIT:
        return line
    shorter = dict(message, reason=str(message.get("reason", ""))[:1000])
    return json.dumps(shorter, separators=(",", ":"), default=str)[:_K8S_LIMIT]
