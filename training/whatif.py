"""What-if on gpubook's own history (issue #15 item 4): the jobs and bookings of the last
days as a simulator workload, replayed under the current scheduler settings and under
another policy, so an admin sees what a change would have done before making it.

The export (`history_export`):
* **Cluster**: every GPU in the inventory, on its own node (nodes of any size).
* **Bookings**: every reservation that is not cancelled and starts in the window, on the GPUs
  it was given (the replay keeps the booking service's real placements). Its job is the
  training job attached to it (the earliest, if several), else a stand-in for the person
  who booked it: it uses the slot as held (to its end, or to its early release) minus the
  grace period.
* **Queued jobs**: training jobs submitted in the window (not attached to an exported
  booking) that ran, still run or still wait. Their duration is the time their runs held
  GPUs; a job still running or waiting needs at least its predicted runtime, else the user's
  estimate, else the policy's default. Jobs cancelled before they ever ran are left out
  (there is no duration to replay). Times are seconds from the window's start.

`history_whatif` replays that workload under `policy_from_settings()` ("current") and the
chosen variant, and returns the matrix's metrics table (`scheduler.sim.report`).
"""

from __future__ import annotations

import csv
import datetime as dt
from dataclasses import dataclass, replace
from pathlib import Path

from django.db.models import Prefetch, Q

import scheduler
from config.scheduling import policy_from_settings
from gpus.models import Gpu
from reservations.models import Reservation
from scheduler.sim.engine import Booking, SimJob
from scheduler.sim.metrics import compute_metrics, series
from scheduler.sim.policies import policy_for
from scheduler.sim.replay import Scenario, run_policy, team_quotas
from scheduler.sim.report import metrics_table, write_html
from scheduler.sim.workload import Workload
from training.models import Run, TrainingJob

# The admin page replays at most this many jobs (the most recent), so a click stays a few
# seconds of work; the command's --max-jobs may go higher.
ADMIN_MAX_JOBS = 2000
CURRENT = "current settings"
# GPU time a resume from a checkpoint costs in the replay (the simulator's default).
RESTART_OVERHEAD_S = 60.0
# A stand-in booking job never runs shorter than this (a booking held for less than its
# grace, e.g. released at once, still means someone came).
MIN_STAND_IN_S = 60.0


@dataclass(frozen=True, slots=True)
class HistoryExport:
    window_start: dt.datetime
    window_end: dt.datetime
    gpus: tuple[scheduler.Gpu, ...]
    workload: Workload
    jobs_exported: int  # training jobs among workload.jobs
    jobs_skipped: int  # cancelled before they ran, or beyond max_jobs

    @property
    def window_s(self) -> tuple[float, float]:
        return (0.0, (self.window_end - self.window_start).total_seconds())


@dataclass(frozen=True, slots=True)
class WhatIf:
    export: HistoryExport
    rows: list[tuple[str, dict]]  # (label, metrics): current settings first
    policy: scheduler.Policy
    table: str


def _seconds(at: dt.datetime, origin: dt.datetime) -> float:
    return (at - origin).total_seconds()


def _run_seconds(runs: list[Run], *, now: dt.datetime) -> float:
    return sum(
        ((run.ended_at or now) - run.started_at).total_seconds() for run in runs if run.started_at
    )


def history_export(
    *, now: dt.datetime, since: dt.timedelta, max_jobs: int | None = None,
    policy: scheduler.Policy | None = None,
) -> HistoryExport:
    policy = policy or policy_from_settings()
    start = now - since
    gpus = tuple(
        scheduler.Gpu(id=pk, node=node_id, index=index)
        for pk, node_id, index in Gpu.objects.order_by("node_id", "index").values_list(
            "pk", "node_id", "index"
        )
    )
    runs = Prefetch("runs", queryset=Run.objects.order_by("pk"))
    reservations = list(
        Reservation.objects.filter(start__gte=start, start__lt=now)
        .exclude(status=Reservation.Status.CANCELLED)
        .select_related("team", "user")
        .prefetch_related("gpus")
        .order_by("start", "pk")
    )
    jobs = list(
        TrainingJob.objects.filter(
            Q(submitted_at__gte=start, submitted_at__lt=now) | Q(reservation__in=reservations)
        )
        .select_related("team", "user")
        .prefetch_related(runs)
        .order_by("submitted_at", "pk")
    )
    exported_reservations = {reservation.pk for reservation in reservations}
    attached: dict[int, TrainingJob] = {}
    for job in jobs:
        if job.reservation_id in exported_reservations:
            attached.setdefault(job.reservation_id, job)
    booking_job_ids = {job.pk for job in attached.values()}
    queued = [job for job in jobs if job.pk not in booking_job_ids]
    skipped = 0
    if max_jobs is not None and len(queued) > max_jobs:
        skipped = len(queued) - max_jobs
        queued = queued[-max_jobs:]

    sim_jobs: list[SimJob] = []
    for job in queued:
        ran_s = _run_seconds(list(job.runs.all()), now=now)
        if job.state in TrainingJob.FINISHED:
            if ran_s <= 0:
                skipped += 1  # cancelled (or failed) before it ever held a GPU
                continue
            duration_s = ran_s
        else:
            expected = job.predicted_duration_s or job.estimated_duration_s
            duration_s = max(ran_s, float(expected or policy.default_estimate_s))
        sim_jobs.append(_sim_job(job, submit_s=_seconds(job.submitted_at, start), duration_s=duration_s))

    bookings: list[Booking] = []
    stand_in_id = max([job.pk for job in jobs], default=0)
    for reservation in reservations:
        start_s = _seconds(reservation.start, start)
        end_s = _seconds(reservation.end, start)
        job = attached.get(reservation.pk)
        if job is not None:
            ran_s = _run_seconds(list(job.runs.all()), now=now)
            duration_s = ran_s if job.state in TrainingJob.FINISHED and ran_s > 0 else max(
                ran_s, float(job.predicted_duration_s or job.estimated_duration_s or end_s - start_s)
            )
            sim_job = _sim_job(job, submit_s=start_s, duration_s=duration_s)
        else:
            held_until = reservation.end
            if reservation.status == Reservation.Status.RELEASED:
                held_until = min(reservation.end, reservation.updated_at)
            stand_in_id += 1
            sim_job = SimJob(
                id=stand_in_id,
                user=reservation.user.username,
                team=reservation.team.slug,
                gpus=reservation.gpu_count,
                submit_s=start_s,
                duration_s=max(_seconds(held_until, reservation.start) - policy.grace_s, MIN_STAND_IN_S),
            )
        sim_job.booking_id = reservation.pk
        sim_jobs.append(sim_job)
        bookings.append(
            Booking(
                id=reservation.pk,
                job_id=sim_job.id,
                gpu_ids=tuple(sorted(gpu.pk for gpu in reservation.gpus.all())),
                start_s=start_s,
                end_s=end_s,
                # A booking entered after its start (an admin's back-dated one) was known then.
                booked_at_s=min(_seconds(reservation.created_at, start), start_s),
                team=reservation.team.slug,
                user=reservation.user.username,
            )
        )
    training_job_ids = {job.pk for job in jobs}
    sim_jobs.sort(key=lambda job: (job.submit_s, job.id))
    booked_gpu_s = sum(job.gpus * job.duration_s for job in sim_jobs if job.booking_id is not None)
    workload = Workload(
        jobs=tuple(sim_jobs),
        bookings=tuple(bookings),
        booking_target_gpu_s=booked_gpu_s,
        booked_gpu_s=booked_gpu_s,
        bookings_shifted=0,
        bookings_refused=0,
    )
    return HistoryExport(
        window_start=start,
        window_end=now,
        gpus=gpus,
        workload=workload,
        jobs_exported=sum(1 for job in sim_jobs if job.id in training_job_ids),
        jobs_skipped=skipped,
    )


def _sim_job(job: TrainingJob, *, submit_s: float, duration_s: float) -> SimJob:
    return SimJob(
        id=job.pk,
        user=job.user.username,
        team=job.team.slug,
        gpus=job.gpus_needed,
        submit_s=submit_s,
        duration_s=duration_s,
        checkpointable=job.checkpointable,
        # The user's own estimate, as plan() got it; without one the replay's estimator
        # learns from the user's finished jobs, as gpubook's does.
        estimate_s=float(job.estimated_duration_s) if job.estimated_duration_s else None,
        priority=scheduler.Priority(job.priority),
    )


def write_trace_csv(export: HistoryExport, path: Path) -> None:
    """The exported jobs in the trace schema of `../shared/traces/` (so `manage.py simulate
    --trace` replays them with synthetic bookings); the real bookings have no column there."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["job_id", "user", "group", "submit_time", "duration_s", "num_gpus", "status"])
        for job in export.workload.jobs:
            writer.writerow([job.id, job.user, job.team, f"{job.submit_s:.3f}", f"{job.duration_s:.3f}",
                             job.gpus, "Pass"])


def what_if_policy(*, name: str, overrides: dict[str, object], current: scheduler.Policy) -> scheduler.Policy:
    """`gpubook` is today's settings with the overrides; a baseline keeps today's grace and
    node rule (a job is never split across nodes unless the settings allow it)."""
    base = current if name == "gpubook" else replace(
        policy_for(name, grace_s=current.grace_s), allow_multi_node=current.allow_multi_node
    )
    return replace(base, **overrides)


def history_whatif(
    *, now: dt.datetime, since: dt.timedelta, policy_name: str, overrides: dict[str, object],
    max_jobs: int | None = None, html: Path | None = None,
) -> WhatIf:
    current = policy_from_settings()
    variant = what_if_policy(name=policy_name, overrides=overrides, current=current)
    export = history_export(now=now, since=since, max_jobs=max_jobs, policy=current)
    if not export.gpus:
        raise ValueError("no GPUs in the inventory: nothing to replay on")
    workload = export.workload
    window = export.window_s
    capacity = len(export.gpus) * max(window[1] - window[0], 1.0)
    offered = sum(job.gpus * min(job.duration_s, window[1] - job.submit_s) for job in workload.jobs)
    load = offered / capacity
    label = policy_name + "".join(f" {key}={value}" for key, value in overrides.items())
    rows: list[tuple[str, dict]] = []
    all_series: dict[str, dict] = {}
    for row_label, name, policy in ((CURRENT, "gpubook", current), (label, policy_name, variant)):
        result, wall_s = run_policy(
            name, workload, gpus_total=len(export.gpus), gpus_per_node=1,
            restart_overhead_s=RESTART_OVERHEAD_S, load=load, grace_s=policy.grace_s, policy=policy,
            run_aware_booking=False, gpus=export.gpus,
        )
        metrics = compute_metrics(
            result, workload, policy_name=name, gpus_total=len(export.gpus), window=window,
            quotas=team_quotas(workload, policy, load), wall_s=wall_s,
        )
        metrics["jobs"] = len(workload.jobs)
        rows.append((row_label, metrics))
        if html is not None:
            all_series[row_label] = series(result, len(export.gpus), window)
    if html is not None:
        write_html(html, all_series, _scenario(export, load=load, grace_s=current.grace_s))
    table = metrics_table(
        ["policy", "jobs", "completed"],
        [([row_label, str(metrics["jobs"]), str(metrics["jobs_completed"])], metrics)
         for row_label, metrics in rows],
    )
    return WhatIf(export=export, rows=rows, policy=variant, table=table)


def _scenario(export: HistoryExport, *, load: float, grace_s: float) -> Scenario:
    workload = export.workload
    window = export.window_s
    nodes: dict[object, int] = {}
    for gpu in export.gpus:
        nodes[gpu.node] = nodes.get(gpu.node, 0) + 1
    return Scenario(
        trace=f"gpubook history {export.window_start:%Y-%m-%d %H:%M} to {export.window_end:%Y-%m-%d %H:%M}",
        jobs=len(workload.jobs),
        gpus=len(export.gpus),
        gpus_per_node=max(nodes.values(), default=0),
        window_start_s=window[0],
        window_end_s=window[1],
        offered_gpus=load * len(export.gpus),
        offered_load=load,
        reservation_share=workload.booked_gpu_s / max(sum(j.gpus * j.duration_s for j in workload.jobs), 1.0),
        bookings=len(workload.bookings),
        booked_gpu_hours=workload.booked_gpu_s / 3600.0,
        bookings_shifted=0,
        bookings_refused=0,
        slot_minutes=0.0,
        restart_overhead_s=RESTART_OVERHEAD_S,
        grace_s=grace_s,
        seed=0,
        large_jobs="as the settings allow",
        checkpointable_share=sum(job.checkpointable for job in workload.jobs) / max(len(workload.jobs), 1),
        quota="per team its demand / offered load (generous), checked after the replay",
    )
