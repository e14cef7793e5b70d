"""Hash the simulator's action logs of a philly window, to show a speed-up changes no decision.

Replays the jobs of `philly.csv` submitted in WINDOW on GPUS GPUs (8 per node) under gpubook
and EASY, with 0 % and 30 % of GPU-hours booked, and prints a hash of each whole action log
(the rows of the golden-log test) with its user CPU. Run it on two trees and compare:

    .venv/bin/python benchmarks/action_log_hash.py 21d:24d 512
    .venv/bin/python benchmarks/action_log_hash.py 21d:24d 512 --root /path/to/main/worktree
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Defaults: the window and size BENCHMARKS.md's hashes were taken on (and `make bench` runs).
    parser.add_argument("window", nargs="?", default="21d:24d",
                        help="START:END trace seconds (s/m/h/d suffix), e.g. 21d:24d")
    parser.add_argument("gpus", nargs="?", type=int, default=512)
    parser.add_argument(
        "--root", type=Path, default=Path(__file__).resolve().parent.parent,
        help="the tree whose scheduler/ to replay (default this one)",
    )
    arguments = parser.parse_args()
    sys.path.insert(0, str(arguments.root.resolve()))
    from benchmarks.eval_matrix import TRACES_DIR
    from scheduler.sim.engine import Simulation, SimulationConfig
    from scheduler.sim.policies import policy_for
    from scheduler.sim.replay import fresh_jobs, team_quotas
    from scheduler.sim.trace import parse_window, read_trace
    from scheduler.sim.workload import build_workload, make_gpus
    from tests.scheduler.golden_replay import action_row

    trace = read_trace(TRACES_DIR / "philly.csv", parse_window(arguments.window))
    for share in (0.0, 0.3):
        gpus = make_gpus(arguments.gpus, 8)
        workload = build_workload(
            trace, gpus=gpus, gpus_per_node=8, reservation_share=share,
            slot_s=1800.0, grace_s=60.0, seed=1,
        )
        for name in ("gpubook", "easy"):
            policy = policy_for(name)
            config = SimulationConfig(
                gpus=gpus, policy=policy, restart_overhead_s=60.0,
                team_quota_gpu_s=team_quotas(workload, policy, 1.0),
                use_estimator=policy.use_estimates, record_actions=True,
            )
            started = time.process_time()
            result = Simulation(
                config, fresh_jobs(workload, without_bookings=False), workload.bookings
            ).run()
            cpu_s = time.process_time() - started
            rows = [action_row(record.at_s, record.action) for record in result.actions]
            digest = hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]
            print(f"{name}@{share}: {len(rows)} actions, sha256 {digest}, {cpu_s:.1f} s CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
