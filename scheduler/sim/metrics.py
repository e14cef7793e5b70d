"""Metrics of one replay, measured over the trace window (first to last submission):

* `utilization`: busy GPU-time / (capacity × window); `utilization_of_offered`: busy GPU-time
  / min(capacity × window, offered), where offered is the GPU-time of the window's jobs
  that could run inside the window (each job from its submission to the window's end).
* `goodput`: GPU-time that advanced jobs (no restart overhead, no lost work) / capacity.
* `wait_*`: first start − submit of queued jobs (bookings excluded; for fifo, booked jobs
  are excluded too so all three measure the same jobs); `slowdown_mean`: bounded slowdown
  (response / max(duration, 10 s)); `jain_fairness`: Jain's index over users' mean slowdown.
* `preemptions`: runs stopped or killed before their job finished, except at the end of
  their own slot; `reservations_honoured`: bookings whose job started at the booked start
  (fifo: the job started when its booking would have begun); `quota_violations`: teams
  whose charge exceeded their quota; `unplaceable_jobs`: jobs larger than the cluster;
  `lost_gpu_hours`: work thrown away by kills and stops of jobs that cannot checkpoint,
  `lost_share` the same over the window's capacity.
* `wait_no_room_share`: the share of queued jobs' waiting spent while the whole cluster had
  fewer idle GPUs (not held by a run) than the job needs, so no placement could have
  started it then without stopping a run. The rest of the wait had room somewhere: spread
  over nodes, held for a waiting wide job, kept free before a booking, or passed over by
  the order. It tells waiting that only more GPUs or stopping runs could cut from waiting a
  placement or order could (#15: BENCHMARKS.md, "Seventh round").
* `requeue_wait_mean_s`: the time queued jobs spent queued *again* after one of their runs was
  stopped (each restart − the stop before it), summed per job and averaged over the same jobs
  as `wait_*`; `requeue_wait_max_s`: the most one job spent so. `wait_*` counts only the wait
  for a first start, so without these a policy that stops runs to start others (queue
  relief, preemptible backfill before bookings) looks better than its stopped jobs see it
  (#15: BENCHMARKS.md, "Twelfth round").
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from itertools import accumulate, pairwise

from scheduler.actions import Reason
from scheduler.sim.engine import RunRecord, SimulationResult
from scheduler.sim.workload import Workload
from scheduler.snapshot import RunKind

SLOWDOWN_BOUND_S = 10.0
SERIES_BIN_S = 3600.0


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(math.ceil(fraction * len(ordered)) - 1, 0)
    return float(ordered[rank])


def jain_index(values: Sequence[float]) -> float:
    if not values:
        return 1.0
    total = sum(values)
    squares = sum(value * value for value in values)
    return total * total / (len(values) * squares) if squares else 1.0


def no_room_share(
    run_records: Iterable[RunRecord], waits: Iterable[tuple[float, float, int]], gpus_total: int
) -> float:
    """Of the waiting intervals (submit, first start, GPUs needed), the share of time during
    which fewer than the GPUs needed were free of runs in the whole cluster. For each width,
    the no-room time accumulates over the busy-GPU step function, so each wait costs two
    bisections."""
    waits = [wait for wait in waits if wait[1] > wait[0]]
    total = sum(end - start for start, end, _ in waits)
    if not total:
        return 0.0
    changes: dict[float, int] = {}
    for record in run_records:
        if record.end_s > record.start_s:
            changes[record.start_s] = changes.get(record.start_s, 0) + record.gpus
            changes[record.end_s] = changes.get(record.end_s, 0) - record.gpus
    times = sorted(changes)
    busy = list(accumulate(changes[at] for at in times))  # GPUs held from times[i] on
    spans = [later - at for at, later in pairwise(times)]
    no_room = 0.0
    for width in {gpus for _, _, gpus in waits}:
        full = [held > gpus_total - width for held in busy]
        # Before times[i]: the no-room time since times[0].
        before = [0.0, *accumulate(
            span if is_full else 0.0 for span, is_full in zip(spans, full[:-1], strict=True)
        )]

        def until(at_s: float, full=full, before=before) -> float:
            i = bisect.bisect_right(times, at_s) - 1
            if i < 0:
                return 0.0
            return before[i] + ((at_s - times[i]) if full[i] else 0.0)

        no_room += sum(until(end) - until(start) for start, end, gpus in waits if gpus == width)
    return no_room / total


def requeue_waits(records: Iterable[RunRecord], skip_job_ids: set[int]) -> dict[int, float]:
    """Per job (those in `skip_job_ids` left out): the time between the end of each of its
    runs and the start of its next run, summed; only jobs run more than once appear."""
    runs_by_job: dict[int, list[RunRecord]] = {}
    for record in records:
        if record.job_id not in skip_job_ids:
            runs_by_job.setdefault(record.job_id, []).append(record)
    waits: dict[int, float] = {}
    for job_id, runs in runs_by_job.items():
        if len(runs) > 1:
            runs.sort(key=lambda record: record.start_s)
            waits[job_id] = sum(later.start_s - earlier.end_s for earlier, later in pairwise(runs))
    return waits


def _overlap(start: float, end: float, window_start: float, window_end: float) -> float:
    return max(0.0, min(end, window_end) - max(start, window_start))


def compute_metrics(
    result: SimulationResult,
    workload: Workload,
    *,
    policy_name: str,
    gpus_total: int,
    window: tuple[float, float],
    quotas: dict[str, float],
    wall_s: float,
) -> dict[str, float | int]:
    window_start, window_end = window
    window_length = max(window_end - window_start, 1.0)
    capacity_gpu_s = gpus_total * window_length
    busy = useful = 0.0
    preemptions = 0
    for record in result.run_records:
        overlap = _overlap(record.start_s, record.end_s, window_start, window_end)
        busy += record.gpus * overlap
        length = record.end_s - record.start_s
        if length > 0:
            useful += record.gpus * overlap * (record.useful_s / length)
        if record.how != "completed" and not (
            record.kind == RunKind.RESERVED and record.how in ("checkpointed", "killed")
        ):
            preemptions += 1
    offered = sum(
        job.gpus * min(job.duration_s, max(window_end - job.submit_s, 0.0))
        for job in workload.jobs
        if window_start <= job.submit_s <= window_end
    )

    booked_job_ids = {booking.job_id for booking in workload.bookings}
    waiting: list[tuple[float, float, int]] = []  # (submit, first start, GPUs)
    slowdowns_by_user: dict[str, list[float]] = {}
    slowdowns: list[float] = []
    for job in result.jobs.values():
        if job.id in booked_job_ids or job.first_start_s is None:
            continue
        waiting.append((job.submit_s, job.first_start_s, job.gpus))
        if job.completed_s is not None:
            slowdown = max(
                (job.completed_s - job.submit_s) / max(job.duration_s, SLOWDOWN_BOUND_S), 1.0
            )
            slowdowns.append(slowdown)
            slowdowns_by_user.setdefault(job.user, []).append(slowdown)

    if policy_name == "fifo":
        honoured = sum(
            1
            for booking in workload.bookings
            if result.jobs[booking.job_id].first_start_s is not None
            and result.jobs[booking.job_id].first_start_s <= booking.start_s + 1e-6
        )
    else:
        # Against the slot as finally booked (the engine's booking service may have given
        # a later slot when the booking was made, as the workload's own service does).
        honoured = sum(
            1
            for booking in result.bookings
            if result.reserved_start_s.get(booking.id, math.inf) <= booking.start_s + 1e-6
        )
    unplaceable = sum(1 for job in result.jobs.values() if job.gpus > gpus_total)
    violations = sum(
        1 for team, charge in result.team_charges_gpu_s.items() if charge > quotas.get(team, 0)
    )
    waits = [first_start_s - submit_s for submit_s, first_start_s, _ in waiting]
    requeued = requeue_waits(result.run_records, booked_job_ids)
    user_means = [sum(values) / len(values) for values in slowdowns_by_user.values()]
    lost_gpu_hours = (
        sum(
            record.gpus * (record.end_s - record.start_s - record.overhead_s - record.useful_s)
            for record in result.run_records
            if record.how in ("killed", "stopped_lost")
        )
        / 3600.0
    )
    return {
        "utilization": busy / capacity_gpu_s,
        "utilization_of_offered": busy / max(min(capacity_gpu_s, offered), 1.0),
        "goodput": useful / capacity_gpu_s,
        "wait_mean_s": sum(waits) / len(waits) if waits else 0.0,
        "wait_p50_s": percentile(waits, 0.5),
        "wait_p95_s": percentile(waits, 0.95),
        "wait_no_room_share": no_room_share(result.run_records, waiting, gpus_total),
        "requeue_wait_mean_s": sum(requeued.values()) / len(waits) if waits else 0.0,
        "requeue_wait_max_s": max(requeued.values(), default=0.0),
        "slowdown_mean": sum(slowdowns) / len(slowdowns) if slowdowns else 0.0,
        "jain_fairness": jain_index(user_means),
        "preemptions": preemptions,
        "reservations_honoured": honoured / len(workload.bookings) if workload.bookings else 1.0,
        "quota_violations": violations,
        "unplaceable_jobs": unplaceable,
        "wall_s": wall_s,
        "jobs_completed": sum(1 for job in result.jobs.values() if job.completed_s is not None),
        "releases_no_show": sum(1 for _, r in result.released.values() if r == Reason.NO_SHOW),
        "releases_early_finish": sum(
            1 for _, reason in result.released.values() if reason == Reason.JOB_FINISHED_EARLY
        ),
        "lost_gpu_hours": lost_gpu_hours,
        # The "work lost to preemption as a share of capacity" (of the window).
        "lost_share": lost_gpu_hours * 3600.0 / capacity_gpu_s,
        "plan_calls": result.plan_calls,
    }


def series(result: SimulationResult, gpus_total: int, window: tuple[float, float]) -> dict:
    """Hourly utilization and queue length, and the sorted waits, for the HTML report."""
    start, end = window
    bins = max(math.ceil((end - start) / SERIES_BIN_S), 1)
    busy = [0.0] * bins
    for record in result.run_records:
        first = max(int((record.start_s - start) // SERIES_BIN_S), 0)
        last = min(int((record.end_s - start) // SERIES_BIN_S), bins - 1)
        for bin_index in range(first, last + 1):
            bin_start = start + bin_index * SERIES_BIN_S
            busy[bin_index] += record.gpus * _overlap(
                record.start_s, record.end_s, bin_start, bin_start + SERIES_BIN_S
            )
    utilization = [value / (gpus_total * SERIES_BIN_S) for value in busy]
    queue = [0] * bins
    for at_s, length in result.queue_length:
        bin_index = int((at_s - start) // SERIES_BIN_S)
        if 0 <= bin_index < bins:
            queue[bin_index] = max(queue[bin_index], length)
    booked = {booking.job_id for booking in result.bookings}
    waits = sorted(
        job.first_start_s - job.submit_s
        for job in result.jobs.values()
        if job.first_start_s is not None and job.id not in booked and job.booking_id is None
    )
    hours = [(start + (index + 0.5) * SERIES_BIN_S) / 3600.0 for index in range(bins)]
    return {"hours": hours, "utilization": utilization, "queue": queue, "waits": waits}
