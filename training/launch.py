"""The launch path: a job's claim becomes a Run, a Run becomes the `RunSpec` an executor starts.

One path for everyone who needs to know what a run is launched as: reconcile's start and
repair, and the `k8s_manifest` preview (so the preview is the launch). Everything a launch
needs about the job comes from its normalized spec (`TrainingJob.parsed_spec`, written at
submit by the parser), never from the raw document.
"""

import dataclasses
import datetime as dt
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction

import scheduler
from gpus.models import Gpu
from notifications.models import EventType
from training.advice import yolo_for_run
from training.executors.base import Executor, ExecutorError, ExecutorUnavailable, RunSpec
from training.jobspec import JobSpec
from training.models import Run, TrainingJob
from training.run_state import notify_run, run_end, run_handle_record, run_mark_running

# A backfill run with no reservation ahead and no time limit still gets a hard end, so the
# executors' backstop (activeDeadlineSeconds, the local supervisor's timer) is always set.
UNBOUNDED_RUN_S = 30 * 86400


def job_spec_of(job: TrainingJob) -> JobSpec:
    """The job's spec as the parser normalized it at submit."""
    return JobSpec.from_dict(job.parsed_spec)


# --- claim --------------------------------------------------------------------------------------
def new_run(
    *, job: TrainingJob, gpus: Sequence[Gpu], kind: str, now: dt.datetime, must_end_by: dt.datetime | None,
    reservation_id: int | None = None, estimated_end: dt.datetime | None = None, preemptible: bool = False,
) -> Run:
    """The (unsaved) Run for `job` on `gpus` (of one node, in index order)."""
    return Run(
        job=job, kind=kind, reservation_id=reservation_id, node=gpus[0].node,
        gpu_ids=[gpu.pk for gpu in gpus], gpu_indices=[gpu.index for gpu in gpus], created_at=now,
        must_end_by=must_end_by or now + dt.timedelta(seconds=job.timeout_s or UNBOUNDED_RUN_S),
        estimated_end=estimated_end, preemptible=preemptible, resumed_from=job.checkpoint_path,
        # Under the team's own directory: a Kubernetes pod mounts only that part of the runs volume.
        output_dir=str(Path(settings.GPUBOOK_RUNS_DIR) / job.team.slug / f"job-{job.pk}"),
    )


def run_claim(action: scheduler.Start, *, now: dt.datetime) -> tuple[Run, str] | None:
    """Write the intent (job running, run starting, its report token's hash) and commit, before
    any executor call; returns the run and its report token. The job's state flip is the
    compare-and-set; the one-live-run-per-job constraint backs it."""
    try:
        with transaction.atomic():
            if not TrainingJob.objects.filter(pk=action.job_id, state=TrainingJob.State.QUEUED).update(
                state=TrainingJob.State.RUNNING
            ):
                return None
            # With what the launch reads next (its image, its node): not one query each per start.
            job = TrainingJob.objects.select_related("team", "image").get(pk=action.job_id)
            gpus = list(Gpu.objects.filter(pk__in=action.gpu_ids).select_related("node").order_by("index"))
            run = new_run(
                job=job, gpus=gpus, kind=str(action.kind),
                now=now, must_end_by=action.must_end_by, reservation_id=action.reservation_id,
                estimated_end=action.estimated_end, preemptible=action.preemptible,
            )
            token = run.issue_report_token()  # stored with the claim: one commit less per start
            run.save()
            return run, token
    except IntegrityError:
        return None  # another reconciler claimed it first


# --- the RunSpec --------------------------------------------------------------------------------
def runner_spec_path(run: Run) -> Path:
    return Path(run.output_dir) / f"spec-run-{run.pk}.json"


def runner_spec(run: Run, token: str) -> dict:
    """The runner's spec for a YOLO job's run (training/runner/spec.py)."""
    spec = job_spec_of(run.job)
    yolo = spec.yolo
    resolved = yolo_for_run(run)  # the image's defaults, the batch for these GPUs (issue #17)
    tune = {}
    if spec.tune is not None:
        # A tune continues from its own output_dir (tune/tune_results.ndjson) and exports nothing.
        tune = {"tune": spec.tune.as_json(), "export": [], "resume_from": None}
    return {
        "run_id": str(run.pk), "model": yolo.model, "data": yolo.data, "epochs": resolved.epochs,
        "imgsz": resolved.imgsz, "batch": resolved.batch, "export": list(resolved.export),
        "device": list(range(len(run.gpu_indices))) if settings.GPUBOOK_RUNNER_DEVICE == "cuda" else "cpu",
        "workers": settings.GPUBOOK_RUNNER_WORKERS, "output_dir": run.output_dir,
        "resume_from": run.resumed_from or None, "must_end_by": run.must_end_by.isoformat(),
        "grace_s": settings.GPUBOOK_STOP_GRACE_SECONDS, "extra": dict(resolved.extra),
        "allow_gpu_count_change": yolo.allow_gpu_count_change,
        "report_url": f"{settings.GPUBOOK_BASE_URL}/api/v1/runs/{run.pk}/report/", "report_token": token,
        **tune,
    }


def runner_argv(run: Run) -> list[str]:
    """A YOLO job runs our runner with a spec file in its output dir; a command job its own argv."""
    spec = job_spec_of(run.job)
    if spec.command:
        return list(spec.command)
    return [settings.GPUBOOK_RUNNER_PYTHON or sys.executable, "-m", "training.runner", "--spec",
            str(runner_spec_path(run))]


def write_runner_spec(run: Run, token: str) -> None:
    if job_spec_of(run.job).yolo is None:
        return
    path = runner_spec_path(run)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(runner_spec(run, token), indent=2))
    path.chmod(0o600)  # it holds the run's report token


def run_spec_for(run: Run) -> RunSpec:
    """What the executor is asked to start for this run: the launch and the preview both."""
    job = run.job
    spec = job_spec_of(job)
    return RunSpec(
        run_id=run.pk, image=settings.GPUBOOK_IMAGE_REGISTRY + job.image.pinned_reference, argv=tuple(runner_argv(run)),
        node_name=run.node.name, gpu_indices=tuple(run.gpu_indices), team=job.team.slug, job_id=job.pk,
        reservation_id=run.reservation_id, must_end_by=run.must_end_by,
        grace_s=int(settings.GPUBOOK_STOP_GRACE_SECONDS), output_dir=run.output_dir, workdir=str(settings.BASE_DIR),
        memory=spec.memory, cpu=spec.cpu,
    )


# --- launch -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Launch:
    outcome: str  # "started" | "retry" (the executor did not answer; the next tick retries) | "ended"
    error: str = ""


def launch(run: Run, *, executor: Executor, now: dt.datetime, token: str | None = None) -> Launch:
    """Start a claimed run: write the runner's spec, call the executor, store the handle it
    returns and mark the run running. `token`: the report token its claim just stored; without
    one (a repair's relaunch: only the hash was kept) a fresh token is issued first."""
    if run.must_end_by <= now:
        run_end(run, state=Run.State.CANCELLED, reason="its slot ended before it could start", exit_code=None, now=now)
        return Launch("ended")
    if token is None:
        token = run.issue_report_token()
        Run.objects.filter(pk=run.pk).update(report_token_hash=run.report_token_hash)
    try:
        write_runner_spec(run, token)
        handle = executor.start(run_spec_for(run), now=now)
    except ExecutorUnavailable as error:
        return Launch("retry", f"run {run.pk}: {error}")  # stays STARTING
    except (ExecutorError, ValueError, OSError) as error:
        run_end(run, state=Run.State.FAILED, reason=f"could not start: {error}", exit_code=None, now=now)
        return Launch("ended", f"run {run.pk}: {error}")
    # One commit for what the start left to record (a tick that starts 50 runs waited on a
    # commit per write, issue #19); a crash before it is repaired like one before the start.
    with transaction.atomic():
        run_handle_record(run=run, handle=handle)
        if run_mark_running(run=run, now=now):
            notify_run(run, EventType.RUN_STARTED, now=now)
    return Launch("started")
