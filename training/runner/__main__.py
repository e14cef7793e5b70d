"""``python -m training.runner --spec spec.json``: see training/runner/cli.py."""

from training.runner.cli import main

raise SystemExit(main())
