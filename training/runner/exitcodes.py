"""Exit codes of the training runner (``python -m training.runner``).

The executors and reconcile import these to decide what a finished process means, so this
module must stay free of dependencies (no Django, no torch).

* ``EXIT_SUCCEEDED``: training finished; weights, results.csv and the artifact manifest exist
  (the ONNX export may still have failed: that is reported, not fatal).
* ``EXIT_FAILED``: the run cannot go on (bad data YAML, out of memory, corrupt checkpoint, ...).
  Retrying the same spec will fail the same way; the reason is in the termination message.
* ``EXIT_BAD_SPEC``: the spec file itself is invalid (a field is missing or wrong, a file it
  names does not exist). Nothing was trained.
* ``EXIT_CHECKPOINTED``: stopped early on request (SIGTERM/SIGINT) or by ``must_end_by``; a
  resumable checkpoint was written (or, when stopped before the first epoch, nothing was lost).
  The job should be resumed in its next run. 75 is ``EX_TEMPFAIL`` from sysexits.h.

A process killed by a signal shows up as ``128 + signal number`` from a shell (137 for
SIGKILL) or as a negative return code from ``subprocess``; :func:`describe` names both.
"""

from __future__ import annotations

EXIT_SUCCEEDED = 0
EXIT_FAILED = 1
EXIT_BAD_SPEC = 2
EXIT_CHECKPOINTED = 75

_NAMES = {
    EXIT_SUCCEEDED: "succeeded",
    EXIT_FAILED: "failed",
    EXIT_BAD_SPEC: "bad_spec",
    EXIT_CHECKPOINTED: "checkpointed",
}


def describe(code: int) -> str:
    """Return a short status word for a runner exit code (``"killed:9"`` for signal deaths)."""
    if code in _NAMES:
        return _NAMES[code]
    if code < 0:
        return f"killed:{-code}"
    if code > 128:
        return f"killed:{code - 128}"
    return f"unknown:{code}"
