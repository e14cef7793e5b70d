"""`make bench`: run every benchmark in this folder, one after another (the machine has two
cores; running them side by side would measure each other). A benchmark that needs hardware
this machine lacks (gpu_check.py: a CUDA GPU) exits `NOT_RUN_HERE` after saying why; it is
listed as not run, not as failed and not as passed."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The exit status of a benchmark that cannot run on this machine (77: automake's "skipped").
NOT_RUN_HERE = 77


def main() -> int:
    failed, not_run = [], []
    for script in sorted(HERE.glob("*.py")):
        if script.name in {"run_all.py", "__init__.py"} or script.name.startswith("_"):
            continue
        print(f"\n===== {script.name} =====", flush=True)
        status = subprocess.run([sys.executable, str(script)], cwd=HERE.parent).returncode
        if status == NOT_RUN_HERE:
            not_run.append(script.name)
        elif status != 0:
            failed.append(script.name)
    if not_run:
        print(f"\nnot run on this machine (see each one's reason above): {', '.join(not_run)}")
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
