"""The simulator's named policies, all built from the one `Policy` class so the baselines run
through the very same `plan()` with features switched off:

* `fifo`: a plain FIFO cluster, no calendar: bookings are submitted as ordinary jobs at their
  booked start; strict order (the head job blocks), no estimates.
* `reservations-only`: the calendar is honoured (GPUs cleared with grace, reserved runs
  started at slot start, stopped at slot end), the queue is strict FIFO without estimates:
  a queued job takes any idle GPU and is stopped when a booking needs it.
* `easy`: EASY backfill with **exact** runtimes (the textbook upper baseline for backfill):
  the calendar is honoured as under reservations-only, the queue is FIFO, and a job behind
  the first one that cannot start may start only where it finishes (by its true duration)
  before that job's reserved start and before the next booking on its GPUs; no preemptible
  backfill, no releases. The replay hands every job its true duration as its estimate.
* `gpubook`: everything: fair share with entry penalty and aging, backfill with runtime
  estimates (Tsafrir), preemptible backfill, EASY protection, queue relief,
  queue drain, no-show/early-finish release.
"""

from __future__ import annotations

from dataclasses import fields

from scheduler.policy import Policy, QueueOrder

POLICY_NAMES = ("fifo", "reservations-only", "easy", "gpubook")
# Policies whose jobs carry their true duration as the estimate.
EXACT_RUNTIME_POLICIES = frozenset({"easy"})
# Policies whose booking service places a booking when it is made, around the runs then
# (gpubook's calendar); the baselines keep the workload's blind first-fit placement.
RUN_AWARE_BOOKING_POLICIES = frozenset({"gpubook"})


def policy_for(name: str, *, grace_s: float = 60.0) -> Policy:
    baseline = Policy(
        grace_s=grace_s,
        queue_order=QueueOrder.FIFO,
        backfill=False,
        use_estimates=False,
        release_no_show=False,
        release_early_finish=False,
        relief_after_s=float("inf"),
        drain_after_s=float("inf"),
        allow_multi_node=True,
    )
    if name in ("fifo", "reservations-only"):
        return baseline
    if name == "easy":
        return Policy(
            grace_s=grace_s,
            queue_order=QueueOrder.FIFO,
            backfill=True,
            use_estimates=True,
            max_preemptions=0,
            backfill_protected_jobs=1,
            # The textbook hold, on the bare estimate (the baseline as first measured).
            protect_as_placed=False,
            release_no_show=False,
            release_early_finish=False,
            relief_after_s=float("inf"),
            drain_after_s=float("inf"),
            allow_multi_node=True,
        )
    if name == "gpubook":
        return Policy(grace_s=grace_s, allow_multi_node=True)
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")


def policy_overrides(texts: list[str]) -> dict[str, object]:
    """`FIELD=VALUE` pairs for a `Policy`, typed by the field's default; ValueError names the
    first that is not a field or not a value of its type."""
    defaults = Policy()
    types = {field.name: type(getattr(defaults, field.name)) for field in fields(Policy)}
    overrides: dict[str, object] = {}
    for text in texts:
        name, separator, value = text.partition("=")
        if not separator or name not in types:
            raise ValueError(f"Policy has no field {name!r} (expected FIELD=VALUE)")
        kind = types[name]
        if kind is bool:
            overrides[name] = value.lower() in ("1", "true", "yes")
        elif kind is int:
            overrides[name] = int(float(value))
        else:
            overrides[name] = kind(value)
    return overrides
