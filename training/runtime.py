"""How long a queued job will run, for backfill and the queue estimate.

The rule is the scheduling core's (`scheduler.predict_runtime`): the owner's recent runs of
similar jobs (same image, model, dataset, epochs and image size, and for a tune the same number
of iterations; for a command job the same image and argv), else of jobs of the same size, else
the user's own estimate, else the default. It is predicted once at submit from the owner's
history and stored with its source, so the job page can say where the figure came from and a
tick reads a column instead of the history.
"""

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import scheduler
from training.models import Run, TrainingJob

HISTORY_JOBS = 50  # the owner's most recent finished jobs considered


def similar_signature(*, image_id: int, parsed_spec: Mapping[str, Any]) -> tuple:
    yolo = parsed_spec.get("yolo") or {}
    tune = parsed_spec.get("tune")
    if yolo and tune:  # a tune of N iterations is like another tune, never like one training
        return ("tune", image_id, yolo.get("model"), yolo.get("data"), yolo.get("epochs"), yolo.get("imgsz"),
                tune.get("iterations"))
    if yolo:
        return ("yolo", image_id, yolo.get("model"), yolo.get("data"), yolo.get("epochs"), yolo.get("imgsz"))
    return ("command", image_id, tuple(parsed_spec.get("command") or ()))


def job_runtime_predict(
    *, user_id: int, image_id: int, parsed_spec: Mapping[str, Any], gpus: int, user_estimate_s: float | None,
) -> scheduler.RuntimeEstimate:
    past_jobs = list(
        TrainingJob.objects.filter(user_id=user_id, state=TrainingJob.State.SUCCEEDED, finished_at__isnull=False)
        .order_by("-finished_at", "-pk")
        .values_list("pk", "image_id", "parsed_spec", "gpus_needed", "finished_at")[:HISTORY_JOBS]
    )
    ran_s: dict[int, float] = defaultdict(float)  # a job trained across slots ran for all its runs
    for job_id, started, ended in Run.objects.filter(
        job_id__in=[pk for pk, *_ in past_jobs], started_at__isnull=False, ended_at__isnull=False
    ).values_list("job_id", "started_at", "ended_at"):
        ran_s[job_id] += max(0.0, (ended - started).total_seconds())
    history = [
        scheduler.PastRun(
            user=user_id, gpus=past_gpus, duration_s=ran_s[pk], ended_at=finished_at, job_id=pk,
            similar=similar_signature(image_id=past_image, parsed_spec=past_spec),
        )
        for pk, past_image, past_spec, past_gpus, finished_at in past_jobs
        if ran_s[pk] > 0
    ]
    return scheduler.predict_runtime(
        history, user=user_id, gpus=gpus, default_s=scheduler.DEFAULT_POLICY.default_estimate_s,
        similar=similar_signature(image_id=image_id, parsed_spec=parsed_spec), user_estimate_s=user_estimate_s,
    )


def predicted_fields(estimate: scheduler.RuntimeEstimate) -> dict:
    """The job's stored prediction. With no history and no estimate the scheduler's own default
    applies at plan time (None), so a change of the default reaches queued jobs too."""
    seconds = None if estimate.source == scheduler.RuntimeSource.DEFAULT else round(estimate.seconds)
    return {"predicted_duration_s": seconds, "runtime_source": str(estimate.source)}


def duration_words(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"

