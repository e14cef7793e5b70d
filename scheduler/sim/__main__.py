"""`python -m scheduler.sim`: the trace-replay command line (`scheduler.sim.cli`)."""

import sys

from scheduler.sim.cli import main

sys.exit(main())
