"""Training job rules: submit, cancel, attach/detach, and the runner's progress reports."""

import datetime as dt
import hmac
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from config.errors import Conflict, DomainError, ErrorCode, NotFound, NotPermitted
from gpus.models import Gpu
from reservations import selectors as reservation_selectors
from reservations.models import Reservation, Team
from training import runtime, seed_style
from training.jobspec import JobSpecError, load_document, parse_job_spec, require_mapping
from training.models import Artifact, Run, RunMetric, Then, TrainingImage, TrainingJob, WaitingFor, hash_token
from training.run_state import run_request_stop
from training.safe_yaml import clip_message


def data_roots_for(team: Team) -> list[str]:
    return [root.replace("{team}", team.slug) for root in settings.GPUBOOK_DATA_ROOTS]


def _commands_refused() -> bool:
    """The local executor would run a command job as the server's own user (it could read
    the server's secrets): refused unless jobs have a user of their own or the workstation
    has a single trusted user (training/executors/local.py)."""
    return settings.GPUBOOK_EXECUTOR == "local" and not settings.GPUBOOK_JOB_USER and not settings.GPUBOOK_SINGLE_USER


def allowed_images() -> dict[str, TrainingImage]:
    return {image.reference: image for image in TrainingImage.objects.filter(allowed=True)}


def largest_node_gpu_count() -> int:
    counts: dict[int, int] = {}
    for node_id in Gpu.objects.filter(state=Gpu.State.ACTIVE).values_list("node_id", flat=True):
        counts[node_id] = counts.get(node_id, 0) + 1
    return max(counts.values(), default=0)


def _check_attachable(*, reservation: Reservation, team: Team, gpus: int, now: dt.datetime) -> None:
    if reservation.team_id != team.pk:
        # Another team's booking answers as a missing one: ids of other teams cannot be probed.
        raise NotFound(ErrorCode.NOT_FOUND, f"No reservation #{reservation.pk} of {team.name}.")
    if reservation.status not in Reservation.UPCOMING_OR_ACTIVE or reservation.end <= now:
        raise Conflict(ErrorCode.RESERVATION_OVER, "That reservation is over or cancelled.")
    if gpus > reservation.gpu_count:
        raise DomainError(
            ErrorCode.TOO_MANY_GPUS, f"The job needs {gpus} GPUs; the reservation has {reservation.gpu_count}."
        )


def job_spec_from_text(*, text: str) -> Any:
    """A spec pasted or uploaded as YAML/JSON text; a syntax error is the caller's to fix."""
    try:
        return load_document(text)
    except JobSpecError as error:
        raise DomainError(ErrorCode.INVALID_SPEC, clip_message(str(error))) from error


def _invalid_spec(error: JobSpecError) -> DomainError:
    # Problems may quote what was sent: each quote is clipped so an answer stays small.
    problems = [(clip_message(str(field), total=120), clip_message(problem)) for field, problem in error.problems]
    return DomainError(ErrorCode.INVALID_SPEC,
        f"The job spec has {len(problems)} problem(s): " + "; ".join(f"{f}: {p}" for f, p in problems[:20]),
        problems=[{"field": field, "problem": problem} for field, problem in problems[:100]],
    )


def job_submit(
    *, user: AbstractBaseUser, document: Any, now: dt.datetime, reservation_id: int | None = None
) -> TrainingJob:
    """Validate a job spec and queue it, or attach it to one of the team's reservations."""
    document = seed_style.normalize_submitted(document)
    try:
        require_mapping(document)  # before the team is looked for in it
    except JobSpecError as error:
        raise _invalid_spec(error) from error
    team_slug = document.get("team")
    team = Team.objects.filter(slug=team_slug).first() if isinstance(team_slug, str) else None
    if team is None:
        raise DomainError(ErrorCode.UNKNOWN_TEAM, f"No team {team_slug!r}; the spec's `team` is the team's slug.")
    if not user.is_superuser and reservation_selectors.team_role(user=user, team_id=team.pk) is None:
        raise NotPermitted(ErrorCode.NOT_TEAM_MEMBER, f"You are not a member of {team.name}.")
    images = allowed_images()
    try:
        spec = parse_job_spec(
            document, allowed_images=set(images), data_roots=data_roots_for(team), max_gpus=largest_node_gpu_count()
        )
    except JobSpecError as error:
        raise _invalid_spec(error) from error
    reservation = None
    if reservation_id is not None:
        reservation = Reservation.objects.filter(pk=reservation_id).first()
        if reservation is None:
            raise NotFound(ErrorCode.NOT_FOUND, f"No reservation #{reservation_id}.")
        _check_attachable(reservation=reservation, team=team, gpus=spec.gpus, now=now)
    epochs_total = None
    if spec.yolo is not None:
        from training import advice  # the image's defaults and the TensorRT rule (issue #17)

        if "engine" in (spec.yolo.export or ()):
            refusal = advice.engine_refusal(reservation=reservation)
            if refusal:
                raise DomainError(
                    ErrorCode.ENGINE_NEEDS_NVIDIA, refusal, problems=[{"field": "yolo.export", "problem": refusal}]
                )
        epochs_total = advice.yolo_advice(
            yolo=spec.as_dict()["yolo"], image=images[spec.image], reservation=reservation, gpus=spec.gpus
        )[0].epochs
        if spec.tune is not None:
            epochs_total = spec.tune.iterations  # a tune job's progress counts iterations
    if spec.command and _commands_refused():
        raise NotPermitted(
            ErrorCode.COMMAND_JOBS_REFUSED,
            "This server runs jobs locally as its own user, so command jobs are refused; YOLO jobs still run. "
            "An admin can set GPUBOOK_JOB_USER (see the README) or GPUBOOK_SINGLE_USER=true.",
        )
    predicted = runtime.job_runtime_predict(
        user_id=user.pk, image_id=images[spec.image].pk, parsed_spec=spec.as_dict(), gpus=spec.gpus,
        user_estimate_s=spec.estimated_duration_s,
    )
    return TrainingJob.objects.create(
        team=team, user=user, name=spec.task_name, image=images[spec.image], spec=dict(document),
        parsed_spec=spec.as_dict(), **runtime.predicted_fields(predicted),
        argv=list(spec.command), gpus_needed=spec.gpus, priority=spec.priority, timeout_s=spec.timeout_s,
        estimated_duration_s=spec.estimated_duration_s, checkpointable=spec.checkpointable,
        reservation=reservation, epochs_total=epochs_total, submitted_at=now,
        # DESIGN.md: a job submitted into a booking continues in the next one; a queued job re-queues.
        then=spec.then or (Then.NEXT_BOOKING if reservation is not None else Then.BACKFILL), then_team=spec.then_team,
    )


def _load_job_for_change(*, job_id: int, actor: AbstractBaseUser) -> TrainingJob:
    job = TrainingJob.objects.select_related("team").filter(pk=job_id).first()
    if job is None:
        raise NotFound(ErrorCode.NOT_FOUND, f"No job #{job_id}.")
    reservation_selectors.require_can_change(
        user=actor, obj=job, not_found=f"No job #{job_id}.",
        not_permitted="Only the submitter, a team manager or an admin may change this job.",
    )
    return job


def job_cancel(*, job_id: int, actor: AbstractBaseUser, now: dt.datetime) -> TrainingJob:
    """Cancel a job. Its live run is marked to stop with a checkpoint; the next reconcile
    delivers the stop (no executor call here: no network inside a transaction)."""
    job = _load_job_for_change(job_id=job_id, actor=actor)
    reason = f"cancelled by {actor.get_username()}"
    with transaction.atomic():
        changed = TrainingJob.objects.filter(pk=job.pk).exclude(state__in=TrainingJob.FINISHED).update(
            state=TrainingJob.State.CANCELLED, reason=reason, finished_at=now
        )
        if not changed:
            raise Conflict(ErrorCode.ALREADY_FINISHED, "This job has already finished.")
        grace = dt.timedelta(seconds=settings.GPUBOOK_STOP_GRACE_SECONDS)
        for run_id in Run.objects.filter(job_id=job.pk, state__in=Run.LIVE).values_list("pk", flat=True):
            run_request_stop(run_id=run_id, now=now, kill_at=now + grace, reason=reason)
    job.refresh_from_db()
    return job


def job_attach(*, job_id: int, reservation_id: int | None, actor: AbstractBaseUser, now: dt.datetime) -> TrainingJob:
    """Attach a waiting job to a reservation (it runs in that slot), or detach it (None: queue)."""
    job = _load_job_for_change(job_id=job_id, actor=actor)
    with transaction.atomic():
        locked = TrainingJob.objects.select_for_update().get(pk=job.pk)
        if locked.state != TrainingJob.State.QUEUED:
            raise Conflict(ErrorCode.NOT_WAITING, "Only a waiting job can be attached or detached.")
        reservation = None
        if reservation_id is not None:
            reservation = Reservation.objects.filter(pk=reservation_id).first()
            if reservation is None:
                raise NotFound(ErrorCode.NOT_FOUND, f"No reservation #{reservation_id}.")
            _check_attachable(reservation=reservation, team=locked.team, gpus=locked.gpus_needed, now=now)
        locked.reservation = reservation
        locked.waiting_for = WaitingFor.SLOT  # in that booking, or in the queue: no longer held
        locked.save(update_fields=["reservation", "waiting_for"])
    return locked


# The runner's event names (training/runner/progress.py).
PROGRESS_EVENTS = {
    "started", "batch", "epoch", "final", "export", "artifacts", "warning", "succeeded", "checkpointed", "failed",
    "iteration",  # a tune run's finished iteration (training/runner/tune.py)
}


def run_report_record(*, run_id: int, token: str, body: Mapping[str, Any], now: dt.datetime) -> RunMetric | None:
    """Store one progress report from a runner. The per-run token is the only credential:
    another run's token, or a finished run's, is refused."""
    run = Run.objects.select_related("job").filter(pk=run_id).first()
    if run is None or not run.report_token_hash or not hmac.compare_digest(run.report_token_hash, hash_token(token)):
        # The same answer as a run that does not exist: a token guess learns nothing.
        raise NotFound(ErrorCode.NOT_FOUND, "Not found.")
    if run.ended_at is not None:
        raise Conflict(ErrorCode.RUN_ENDED, "This run has ended; its report token no longer writes.")
    event = body.get("event")
    if event not in PROGRESS_EVENTS:
        raise DomainError(ErrorCode.INVALID_REPORT, f"Unknown event {event!r}.")
    epoch = body.get("epoch")
    if epoch is not None and (not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0):
        raise DomainError(ErrorCode.INVALID_REPORT, "`epoch` must be a non-negative integer.")
    metrics = body.get("metrics") or {}
    if not isinstance(metrics, Mapping):
        raise DomainError(ErrorCode.INVALID_REPORT, "`metrics` must be an object.")
    clean = {str(key)[:64]: value for key, value in metrics.items() if isinstance(value, int | float | str)}
    with transaction.atomic():
        Run.objects.filter(pk=run.pk).update(progress={"event": event, "epoch": epoch, **clean, "at": now.isoformat()})
        # A tune job's progress is its iterations; the epochs inside one iteration do not count.
        counted = "iteration" if run.job.parsed_spec.get("tune") else "epoch"
        if event == counted and epoch is not None:
            TrainingJob.objects.filter(pk=run.job_id, epochs_done__lt=epoch).update(epochs_done=epoch)
        if event == "artifacts":
            detail = body.get("detail") or {}
            _record_artifacts(run=run, items=detail.get("artifacts") if isinstance(detail, Mapping) else None, now=now)
        if event == "batch":
            return None  # progress only; the series keeps epoch-level points
        return RunMetric.objects.create(run=run, event=event, epoch=epoch, values=clean, at=now)


def _record_artifacts(*, run: Run, items: Any, now: dt.datetime) -> None:
    if not isinstance(items, list):
        raise DomainError(ErrorCode.INVALID_REPORT, "`artifacts` must be a list.")
    for item in items:
        if not isinstance(item, Mapping) or not all(key in item for key in ("name", "path", "size", "sha256")):
            raise DomainError(ErrorCode.INVALID_REPORT, "each artifact needs name, path, size and sha256.")
        Artifact.objects.update_or_create(
            run=run, name=str(item["name"])[:200],
            defaults={"path": str(item["path"])[:500], "size_bytes": int(item["size"]),
                      "sha256": str(item["sha256"])[:64], "created_at": now},
        )
