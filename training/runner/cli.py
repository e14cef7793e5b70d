"""Command line: ``python -m training.runner --spec spec.json [--check]``.

stdout carries only progress events (JSON lines, see progress.py): everything else that
writes to stdout, Ultralytics' logs and progress bars included, is moved to stderr at start.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import IO, Any

from training.runner import exitcodes
from training.runner.spec import RunSpec, SpecError, load_spec
from training.runner.termination import termination_message, write_termination

DESCRIPTION = """\
Train an Ultralytics YOLO model as a gpubook run: progress as JSON lines on stdout (and POSTed
to the spec's report_url), a resumable checkpoint and exit code 75 on SIGTERM or at
must_end_by - grace_s, resume from a checkpoint, ONNX export and an artifact manifest at the end.
Exit codes: 0 succeeded, 1 failed, 2 bad spec, 75 checkpointed (resume later).
The spec's fields are described in training/runner/spec.py."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.runner", description=DESCRIPTION)
    parser.add_argument("--spec", required=True, type=Path, help="the run spec (JSON file)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="validate the spec and the files it names, print it, and exit (needs no torch)",
    )
    parser.add_argument("--ddp-rank", type=int, default=None, help=argparse.SUPPRESS)  # set by the DDP launcher
    options = parser.parse_args(argv)
    events = _claim_stdout()
    try:
        spec = load_spec(options.spec)
    except SpecError as exc:
        return _bad_spec(options.spec, exc, events)
    if options.check:
        events.write(json.dumps({"ok": True, "spec": spec_summary(spec)}) + "\n")
        events.flush()
        return exitcodes.EXIT_SUCCEEDED

    from training.runner.run import run

    code = run(spec, events, ddp_rank=options.ddp_rank)
    code = exitcodes.EXIT_FAILED if code is None else code
    if options.ddp_rank is not None:
        from training.runner.ddp import exit_worker

        exit_worker(code, events)  # a worker's code must survive teardown (see ddp.py "Exit")
    return code


def spec_summary(spec: RunSpec) -> dict[str, Any]:
    """The validated spec as JSON-able values, token redacted."""
    out: dict[str, Any] = {}
    for name in spec.__dataclass_fields__:
        value = getattr(spec, name)
        if name == "report_token":
            value = "***" if value else None
        elif isinstance(value, Path):
            value = str(value)
        elif hasattr(value, "isoformat"):
            value = value.isoformat().replace("+00:00", "Z")
        elif isinstance(value, tuple):
            value = list(value)
        elif name == "extra":
            value = dict(value)
        elif name == "tune" and value is not None:
            value = value.as_json()
        out[name] = value
    return out


def _claim_stdout() -> IO[str]:
    """Keep the real stdout for events; point fd 1 (and so every print) at stderr."""
    sys.stdout.flush()
    events = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    return events


def _bad_spec(path: Path, exc: SpecError, events: IO[str]) -> int:
    """Report a bad spec the same way as any other end, where the spec allows it."""
    raw: dict[str, Any] = {}
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
        raw = loaded if isinstance(loaded, dict) else {}
    except (OSError, ValueError):
        pass
    run_id = str(raw.get("run_id", "")) if isinstance(raw.get("run_id"), str | int) else ""
    message = termination_message(
        run_id=run_id,
        status="failed",
        exit_code=exitcodes.EXIT_BAD_SPEC,
        reason=str(exc),
        error="spec",
    )
    output_dir = raw.get("output_dir")
    target = Path(output_dir) if isinstance(output_dir, str) and output_dir.strip() else None
    if target is not None and target.exists() and not target.is_dir():
        target = None
    write_termination(message, target)
    body = {
        "run_id": run_id,
        "event": "failed",
        "epoch": 0,
        "epochs": 0,
        "metrics": {},
        "time": message["time"],
        "detail": message,
    }
    events.write(json.dumps(body, separators=(",", ":")) + "\n")
    events.flush()
    print(f"gpubook-runner: {exc}", file=sys.stderr)
    return exitcodes.EXIT_BAD_SPEC
