"""`make bench`: run every benchmark in this folder, one after another (the machine has two
cores; running them side by side would measure each other)."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    failed = []
    for script in sorted(HERE.glob("*.py")):
        if script.name in {"run_all.py", "__init__.py"} or script.name.startswith("_"):
            continue
        print(f"\n===== {script.name} =====", flush=True)
        if subprocess.run([sys.executable, str(script)], cwd=HERE.parent).returncode != 0:
            failed.append(script.name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
