"""A run's state changes and its executor handle, in one place.

The handle is what the executor's `start` returned, stored on the Run as `Handle.as_dict()`;
every caller that talks to the executor about a run (reconcile, repair, the API, the pages,
the watchdog) reads it through `run_handle`. Nobody rebuilds one by hand: a Kubernetes
handle carries the namespace the Job was created in, which only the executor knows.
"""

from training.executors.base import Handle
from training.models import Run


def run_handle(run: Run) -> Handle | None:
    """The handle the executor gave for this run, or None if it was never started (or the
    tick that started it crashed before recording it; observing the run records it then)."""
    return Handle.from_dict(run.handle) if run.handle else None


def run_handle_record(*, run: Run, handle: Handle) -> None:
    """Store the executor's handle on the run (idempotent: a repeated start returns the same)."""
    data = handle.as_dict()
    if run.handle != data:
        Run.objects.filter(pk=run.pk).update(handle=data)
        run.handle = data
