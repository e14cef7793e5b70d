"""The best values of a tune as reported (training/tuning.py) and the API that offers them."""

import datetime as dt

import pytest
from django.utils import timezone

from tests.support import client_for
from training.models import Run, RunMetric, TrainingImage, TrainingJob

H = dt.timedelta(hours=1)
SPEC = {"task_name": "pcb-tune", "image": "yolo:v8n-cu118", "team": "vision",
        "yolo": {"model": "yolov8n.yaml", "data": "/data/vision/pcb/data.yaml", "epochs": 5,
                 "extra": {"mosaic": 0.5}},
        "tune": {"iterations": 4}}


def make_job(people, inventory, *, tune=True):
    job = TrainingJob.objects.create(
        team=people["vision"], user=people["owner"], name="pcb-tune", image=TrainingImage.objects.get(tag="v8n-cu118"),
        spec=SPEC, parsed_spec={"tune": {"iterations": 4, "space": None}} if tune else {}, submitted_at=timezone.now(),
        state=TrainingJob.State.RUNNING, epochs_total=4,
    )
    runs = [Run.objects.create(job=job, kind="backfill", node=inventory["node_a"], gpu_ids=[], gpu_indices=[0],
                               created_at=timezone.now(), must_end_by=timezone.now() + H, state=state)
            for state in (Run.State.CHECKPOINTED, Run.State.RUNNING)]
    return job, runs


def report(run, iteration, fitness, **hyperparameters):
    RunMetric.objects.create(run=run, event="iteration", epoch=iteration, at=timezone.now(), values={
        "iteration": iteration, "fitness": fitness, "mAP50-95": fitness / 2,
        **{f"hyp.{key}": value for key, value in hyperparameters.items()}})


@pytest.mark.django_db
def test_the_best_iteration_across_runs_becomes_a_job_spec(people, inventory):
    job, (first, second) = make_job(people, inventory)
    report(first, 1, 0.30, lr0=0.01, close_mosaic=10)
    report(second, 1, 0.10, lr0=0.01, close_mosaic=10)  # reported again by the resumed run: the last counts
    report(second, 2, 0.42, lr0=0.004, close_mosaic=3.0)
    report(second, 3, 0.42, lr0=0.002, close_mosaic=5)  # as good as 2: the earlier wins, as in Ultralytics
    api = client_for(people["teammate"], api=True)

    answer = api.get(f"/api/v1/jobs/{job.pk}/tuned-spec/").json()
    assert answer["iteration"] == 2 and answer["fitness"] == 0.42
    assert answer["hyperparameters"] == {"lr0": 0.004, "close_mosaic": 3.0}
    spec = answer["spec"]
    assert "tune" not in spec and spec["task_name"] == "pcb-tune-tuned"
    # The job's own extra stays; the tuned values and the tune's optimizer join it; an integer
    # argument is an integer again.
    assert spec["yolo"]["extra"] == {"mosaic": 0.5, "optimizer": "AdamW", "lr0": 0.004, "close_mosaic": 3}
    assert type(spec["yolo"]["extra"]["close_mosaic"]) is int

    page = client_for(people["owner"]).get(f"/runs/{second.pk}/")
    assert page.context["tune"]["series"] == {"iterations": [1, 2, 3], "fitness": [0.1, 0.42, 0.42],
                                              "best": [0.1, 0.42, 0.42], "mAP50-95": [0.05, 0.21, 0.21]}


@pytest.mark.django_db
def test_a_job_that_is_no_tune_or_has_no_iteration_yet_is_refused(people, inventory):
    api = client_for(people["owner"], api=True)
    job, _ = make_job(people, inventory)
    answer = api.get(f"/api/v1/jobs/{job.pk}/tuned-spec/")
    assert answer.status_code == 409 and answer.json()["code"] == "no_tune_result"
    plain, _ = make_job(people, inventory, tune=False)
    answer = api.get(f"/api/v1/jobs/{plain.pk}/tuned-spec/")
    assert answer.status_code == 409 and answer.json()["code"] == "not_a_tune"
    # The form says why instead of filling anything in.
    page = client_for(people["owner"]).get(f"/jobs/?from_tune={job.pk}")
    assert page.status_code == 200 and "has not finished a tune iteration yet" in page.content.decode()
    assert client_for(people["outsider"]).get(f"/jobs/?from_tune={job.pk}").status_code == 404
