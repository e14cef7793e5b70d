"""The cheap benchmarks still run end to end. CI does not run `make bench`, and three benchmarks
broke unnoticed when the placement rules and the security defaults changed (2026-12-07). Each
runs here in a small mode, as `make bench` runs it (a subprocess from the repository root, its
own PostgreSQL database). It must exit 0 and print its figures. The figures themselves are not
judged here: performance lives in BENCHMARKS.md."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


@pytest.mark.parametrize(("script", "arguments", "printed"), [
    # 300 runs started by reconcile, then a tick that starts 50 more.
    ("tick_scale.py", ["--scales", "1", "--ticks", "2"], "tick that starts 50 runs: median"),
    # Celery worker and beat start and stop every slot's job; none may be missing.
    ("slot_lateness.py", ["--slots", "3"], "slot lateness over 3 slots (missing 0)"),
])
def test_the_benchmark_runs(script, arguments, printed):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *arguments],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert printed in done.stdout, done.stdout[-4000:]
