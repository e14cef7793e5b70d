import sys
from pathlib import Path

# The CLI is its own package (cli/); `make install` installs it, and this makes the tests
# independent of whether the checkout at hand was installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "cli"))
