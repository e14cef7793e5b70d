"""The model registry: a run's best weights promoted to a named, versioned model of its team
("vision/pcb-defect" v3), with the metrics, data and spec that made them frozen on the version.

Writes (``model_promote``) and reads (``models_visible_to``, ``version_compare``, the export
files of a version) for the pages and the API alike.
"""

import datetime as dt
import re
from pathlib import Path

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import Max, QuerySet

from config.errors import Conflict, DomainError, ErrorCode, NotFound
from reservations import selectors as reservation_selectors
from reservations.models import Team
from training.models import Artifact, ModelVersion, RegisteredModel, Run, RunMetric

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,99}$")
# Shown first when two versions are compared; any other metric the runs reported follows.
HEADLINE_METRICS = ("mAP50-95", "mAP50", "precision", "recall", "fitness")


def final_metrics(run: Run) -> dict:
    """The run's last validation figures: "final" (best.pt validated) comes after the epochs."""
    values: dict = {}
    for metric in RunMetric.objects.filter(run=run, event__in=("final", "epoch")).order_by("id"):
        values = metric.values
    return {key: value for key, value in values.items() if isinstance(value, int | float)}


def _may_use_team(user: AbstractBaseUser, team: Team) -> bool:
    return user.is_superuser or reservation_selectors.team_role(user=user, team_id=team.pk) is not None


def model_promote(*, run_id: int, name: str, actor: AbstractBaseUser, now: dt.datetime, note: str = "") -> ModelVersion:
    """Promote a succeeded run's best weights to the next version of its team's model ``name``
    (created on first promotion). Versions count 1, 2, 3… per model; two promotions at once
    are serialized by a lock on the model row, and the unique constraint is the last word."""
    if not isinstance(name, str) or not NAME.match(name):
        raise DomainError(
            ErrorCode.INVALID_NAME, "A model name is lower-case letters, digits and dashes (e.g. pcb-defect)."
        )
    run = Run.objects.select_related("job__team").filter(pk=run_id).first()
    if run is None or not _may_use_team(actor, run.job.team):
        raise NotFound(ErrorCode.NOT_FOUND, f"No run #{run_id}.")
    if run.state != Run.State.SUCCEEDED:
        raise Conflict(ErrorCode.RUN_NOT_SUCCEEDED, f"Run #{run.pk} has not succeeded ({run.state}); only finished "
                                            "trainings can be promoted.")
    weights = Artifact.objects.filter(run=run, name="best.pt").first()
    if weights is None:
        raise Conflict(ErrorCode.NO_WEIGHTS, f"Run #{run.pk} has no best.pt artifact to promote.")
    team = run.job.team
    spec = run.job.spec or {}
    yolo = spec.get("yolo") if isinstance(spec.get("yolo"), dict) else {}
    try:
        with transaction.atomic():
            model, _ = RegisteredModel.objects.get_or_create(team=team, name=name, defaults={"created_at": now})
            model = RegisteredModel.objects.select_for_update().get(pk=model.pk)
            if ModelVersion.objects.filter(model=model, run=run).exists():
                raise Conflict(ErrorCode.ALREADY_PROMOTED, f"Run #{run.pk} is already a version of {model.full_name}.")
            latest = ModelVersion.objects.filter(model=model).aggregate(latest=Max("version"))["latest"] or 0
            return ModelVersion.objects.create(
                model=model, version=latest + 1, run=run, metrics=final_metrics(run), data=str(yolo.get("data", "")),
                spec=spec, weights_sha256=weights.sha256, note=note[:500], promoted_by=actor, promoted_at=now,
            )
    except IntegrityError as error:  # a concurrent first promotion created the same model
        raise Conflict(
            ErrorCode.BUSY, "Another promotion of this model happened at the same moment; try again."
        ) from error


def models_visible_to(*, user: AbstractBaseUser) -> QuerySet[RegisteredModel]:
    models = RegisteredModel.objects.select_related("team")
    if user.is_superuser:
        return models
    return models.filter(team__in=Team.objects.filter(memberships__user=user))


def model_get(*, user: AbstractBaseUser, team_slug: str, name: str) -> RegisteredModel:
    model = models_visible_to(user=user).filter(team__slug=team_slug, name=name).first()
    if model is None:
        raise NotFound(ErrorCode.NOT_FOUND, f"No model {team_slug}/{name}.")
    return model


def model_by_id(*, user: AbstractBaseUser, model_id: int) -> RegisteredModel:
    model = models_visible_to(user=user).filter(pk=model_id).first()
    if model is None:
        raise NotFound(ErrorCode.NOT_FOUND, f"No model #{model_id}.")
    return model


def version_get(*, model: RegisteredModel, version: int) -> ModelVersion:
    found = model.versions.select_related("run", "promoted_by").filter(version=version).first()
    if found is None:
        raise NotFound(ErrorCode.NOT_FOUND, f"{model.full_name} has no version {version}.")
    return found


def version_compare(*, a: ModelVersion, b: ModelVersion) -> list[dict]:
    """Rows of {"metric", "a", "b", "change"} for every metric either version has: the
    headline metrics first, then the rest by name. ``change`` is b − a where both are numbers."""
    names = [key for key in HEADLINE_METRICS if key in a.metrics or key in b.metrics]
    names += sorted((set(a.metrics) | set(b.metrics)) - set(names))
    rows = []
    for name in names:
        left, right = a.metrics.get(name), b.metrics.get(name)
        change = right - left if isinstance(left, int | float) and isinstance(right, int | float) else None
        rows.append({"metric": name, "a": left, "b": right, "change": change})
    return rows


def version_files(*, version: ModelVersion) -> list[Artifact]:
    """The version's downloadable files: its weights and every export of its run."""
    return list(Artifact.objects.filter(run=version.run).order_by("name"))


def version_file_path(*, version: ModelVersion, name: str) -> Path:
    artifact = Artifact.objects.filter(run=version.run, name=name).first()
    if artifact is None:
        raise NotFound(ErrorCode.NOT_FOUND, f"{version} has no file {name!r}.")
    base = Path(version.run.output_dir).resolve()
    path = (base / artifact.path).resolve()
    if not path.is_relative_to(base) or not path.is_file():  # never serve outside the run's folder
        raise NotFound(ErrorCode.FILE_GONE, f"{name} of {version} is not on disk any more.")
    return path
