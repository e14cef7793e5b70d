"""gunicorn settings for the benchmarks (``-c benchmarks/_gunicorn_ready.py``): each worker
touches ``$GPUBOOK_BENCH_READY_DIR/<pid>`` once it has loaded the app. The master listens
before its workers have imported Django, so a connection that succeeds does not mean a
booted server; a benchmark waits for one file per worker before it starts its clock."""

import os
from pathlib import Path


def post_worker_init(worker) -> None:
    Path(os.environ["GPUBOOK_BENCH_READY_DIR"], str(worker.pid)).touch()
