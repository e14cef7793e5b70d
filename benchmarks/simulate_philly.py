"""Trace replay of Microsoft Philly (`../shared/traces/philly.csv`) through plan().

1. **Speed**: the whole trace (14,929 jobs) on 1,024 GPUs under the gpubook policy.
   Goal: ≤ 60 s wall.
2. **Quality**: the whole trace on 1,088 GPUs, where the offered load (GPU-hours submitted /
   submission window) is 90 % of capacity, with 30 % of GPU-hours booked ahead in the
   calendar; fifo, reservations-only and gpubook side by side, FIFO the baseline. Aims:
   100 % reservations honoured, gpubook utilization ≥ 90 % of min(capacity, offered), mean
   wait ≤ half of FIFO's, Jain fairness no worse than FIFO's.

    .venv/bin/python benchmarks/simulate_philly.py [--only speed|quality]

The exact simulator commands are printed, so each figure can be reproduced alone.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scheduler.sim import cli as simulate  # noqa: E402
from scheduler.sim.report import format_report  # noqa: E402

TRACE = (ROOT.parent / "shared" / "traces" / "philly.csv").resolve()
SPEED_GPUS = 1024
QUALITY_GPUS = 1088


def run(argv: list[str]) -> dict:
    print("$ .venv/bin/python -m scheduler.sim " + " ".join(argv), flush=True)
    return simulate.simulate(simulate.build_parser().parse_args(argv))


def speed() -> None:
    started = time.perf_counter()
    report = run(["--trace", str(TRACE), "--gpus", str(SPEED_GPUS), "--policy", "gpubook"])
    total_s = time.perf_counter() - started
    metrics = report["policies"]["gpubook"]
    print(
        f"speed: whole philly.csv ({report['scenario']['jobs']} jobs) on {SPEED_GPUS} GPUs, "
        f"gpubook: {metrics['wall_s']:.1f} s simulated ({metrics['plan_calls']} plan() calls, "
        f"{metrics['wall_s'] / metrics['plan_calls'] * 1000:.2f} ms each), {total_s:.1f} s with "
        f"trace loading and booking; goal <= 60 s: "
        f"{'met' if metrics['wall_s'] <= 60 else 'NOT met'}"
    )


def quality() -> None:
    report = run(
        [
            "--trace", str(TRACE), "--gpus", str(QUALITY_GPUS), "--reservation-share", "0.3",
            "--policy", "fifo,reservations-only,gpubook", "--seed", "1",
        ]
    )
    print(format_report(report))
    fifo = report["policies"]["fifo"]
    gpubook = report["policies"]["gpubook"]
    checks = [
        ("reservations honoured = 100 %", gpubook["reservations_honoured"] == 1.0,
         f"{gpubook['reservations_honoured']:.1%}"),
        ("utilization of offered >= 90 %", gpubook["utilization_of_offered"] >= 0.9,
         f"{gpubook['utilization_of_offered']:.1%}"),
        ("mean wait <= 1/2 FIFO", gpubook["wait_mean_s"] <= fifo["wait_mean_s"] / 2,
         f"{gpubook['wait_mean_s'] / max(fifo['wait_mean_s'], 1e-9):.2f}x FIFO"),
        ("Jain fairness >= FIFO", gpubook["jain_fairness"] >= fifo["jain_fairness"],
         f"{gpubook['jain_fairness']:.3f} vs {fifo['jain_fairness']:.3f}"),
        ("quota violations = 0", gpubook["quota_violations"] == 0,
         str(gpubook["quota_violations"])),
    ]
    print("gpubook against the aims (baseline FIFO):")
    for name, met, value in checks:
        print(f"  {name:<34} {value:>16}   {'met' if met else 'NOT met'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["speed", "quality"])
    arguments = parser.parse_args()
    if not TRACE.exists():
        print(f"trace not found: {TRACE}", file=sys.stderr)
        return 1
    if arguments.only in (None, "speed"):
        speed()
    if arguments.only in (None, "quality"):
        quality()
    return 0


if __name__ == "__main__":
    sys.exit(main())
