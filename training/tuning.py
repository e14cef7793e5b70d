"""Hyper-parameter tuning jobs on the server (a job's `tune:`, issue #17): their iterations as
the runner reported them, the best values, and the job spec those values make. The runner's
side is training/runner/tune.py.

Each finished iteration arrives as an `iteration` report (a RunMetric row) with its fitness and
every tuned value as `hyp.<name>`. A tune spans runs (a slot end, a resume), so its iterations
are read across all of the job's runs; an iteration reported twice counts once (the last).
"""

import copy
import dataclasses
from typing import Any

import yaml

from config.errors import Conflict, ErrorCode
from training.models import RunMetric, TrainingJob
from training.runner.spec import EXTRA_ARGS, TUNE_DEFAULT_OPTIMIZER

HYPERPARAMETER_PREFIX = "hyp."


@dataclasses.dataclass(frozen=True)
class TunePoint:
    iteration: int
    fitness: float
    hyperparameters: dict[str, float | int]
    metrics: dict[str, float | int]


def is_tune(job: TrainingJob) -> bool:
    return bool((job.parsed_spec or {}).get("tune"))


def tune_points(*, job: TrainingJob) -> list[TunePoint]:
    """The job's finished iterations in order, one point each."""
    by_iteration: dict[int, TunePoint] = {}
    for values in RunMetric.objects.filter(run__job=job, event="iteration").order_by("run_id", "id").values_list(
        "values", flat=True
    ):
        iteration, fitness = values.get("iteration"), values.get("fitness")
        if not isinstance(iteration, int) or not isinstance(fitness, int | float):
            continue
        by_iteration[iteration] = TunePoint(
            iteration=iteration, fitness=float(fitness),
            hyperparameters={key.removeprefix(HYPERPARAMETER_PREFIX): value for key, value in values.items()
                             if key.startswith(HYPERPARAMETER_PREFIX)},
            metrics={key: value for key, value in values.items() if not key.startswith(HYPERPARAMETER_PREFIX)},
        )
    return [by_iteration[iteration] for iteration in sorted(by_iteration)]


def best_point(points: list[TunePoint]) -> TunePoint | None:
    """The highest fitness; the earliest of equals, as Ultralytics' tuner picks it."""
    return max(points, key=lambda point: (point.fitness, -point.iteration), default=None)


def tune_series(points: list[TunePoint]) -> dict[str, list]:
    """The curve of the run page: fitness per iteration, the best so far, and mAP50-95."""
    best_so_far: list[float] = []
    for point in points:
        best_so_far.append(max(point.fitness, best_so_far[-1]) if best_so_far else point.fitness)
    return {
        "iterations": [point.iteration for point in points],
        "fitness": [point.fitness for point in points],
        "best": best_so_far,
        "mAP50-95": [point.metrics.get("mAP50-95") for point in points],
    }


def tuned_document(*, job: TrainingJob, point: TunePoint) -> dict[str, Any]:
    """The tune job's spec as submitted, made into one training with `point`'s values: no
    `tune`, the values in `yolo.extra`, and the optimizer the tune trained with."""
    document = copy.deepcopy(job.spec)
    document.pop("tune", None)
    document["task_name"] = f"{job.name}-tuned"[:200]
    yolo = dict(document.get("yolo") or {})
    extra = dict(yolo.get("extra") or {})
    extra.setdefault("optimizer", TUNE_DEFAULT_OPTIMIZER)
    for key, value in point.hyperparameters.items():
        check = EXTRA_ARGS.get(key)
        if check is None:
            continue  # not a train argument (any more): the new job could not take it
        if not check(value) and isinstance(value, float) and value.is_integer():
            value = int(value)  # an integer argument that came back through JSON as 3.0
        extra[key] = value
    yolo["extra"] = extra
    document["yolo"] = yolo
    return document


def job_tuned_spec(*, job: TrainingJob) -> tuple[TunePoint, dict[str, Any]]:
    """(the best iteration so far, the job spec it makes); refused for a job that is no tune
    or has not finished an iteration."""
    if not is_tune(job):
        raise Conflict(ErrorCode.NOT_A_TUNE, f"Job #{job.pk} is not a hyper-parameter tune.")
    best = best_point(tune_points(job=job))
    if best is None:
        raise Conflict(ErrorCode.NO_TUNE_RESULT, f"Job #{job.pk} has not finished a tune iteration yet.")
    return best, tuned_document(job=job, point=best)


def spec_text(document: dict[str, Any], *, best: TunePoint) -> str:
    """The spec as YAML for the submit form, saying where its values came from."""
    head = f"# The tune's best values: iteration {best.iteration}, fitness {best.fitness:.5g}.\n"
    return head + yaml.safe_dump(document, sort_keys=False, allow_unicode=True)
