"""The benchmarks still run end to end. CI does not run `make bench`, and three benchmarks broke
unnoticed when the placement rules and the security defaults changed (2026-12-07); a fourth
(memory) crashed on any request count but its default. Each runs here as `make bench` runs it
(a subprocess from the repository root) and must exit 0 and print its figures; the figures
themselves are not judged here (performance lives in BENCHMARKS.md). Those that need the
server stack run in a small mode, each on its own PostgreSQL database, about two minutes in
all; the pure replays take seconds, on either database. Left out, at a minute or more each:
production_path (Chromium loads; the browser test drives the same production stack),
simulate_philly, scheduler_estimates, calendar_events and runner_overhead (real trainings)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_benchmark(script: str, arguments: list[str]) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *arguments],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done.stdout


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.parametrize(("script", "arguments", "printed"), [
    # 300 runs started by reconcile, then a tick that starts 50 more.
    ("tick_scale.py", ["--scales", "1", "--ticks", "2"], "tick that starts 50 runs: median"),
    # Celery worker and beat start and stop every slot's job; none may be missing.
    ("slot_lateness.py", ["--slots", "3"], "slot lateness over 3 slots (missing 0)"),
    # The same slots through the Kubernetes executor and the wire-level fake API server.
    ("k8s_lateness.py", ["--slots", "3"], "kubernetes executor, slot lateness over 3 slots (missing 0)"),
    # The booking API under gunicorn against raw SQL; neither may double-book.
    ("booking.py", ["--clients", "2", "--attempts-per-client", "5", "--workers", "1",
                    "--threads", "2", "--warmup", "1"], "double bookings: raw 0, api 0"),
    ("reports.py", ["--gpus", "8", "--days", "2", "--repeat", "1"], "ingest: 8 GPUs"),
    # A request count that is not a multiple of the benchmark's 2,000-request marks.
    ("memory.py", ["--requests", "300"], "RSS after 300 / after 100"),
])
def test_the_benchmark_runs(script, arguments, printed):
    stdout = run_benchmark(script, arguments)
    assert printed in stdout, stdout[-4000:]


@pytest.mark.parametrize(("script", "arguments", "printed"), [
    # One trace, one seed: the matrix and its verdicts.
    ("eval_matrix.py", ["--seeds", "1", "--traces", "philly", "--policies", "fifo,gpubook"],
     "gpubook meets every target on"),
    ("action_log_hash.py", ["21d:21.2d", "64"], "gpubook@0.3:"),
    ("scheduler_plan.py", [], "doubled / base ="),
    ("continuation_replay.py", ["--seeds", "1"], "ratio to the baseline's median completion"),
])
def test_the_replay_benchmark_runs(script, arguments, printed):
    stdout = run_benchmark(script, arguments)
    assert printed in stdout, stdout[-4000:]
