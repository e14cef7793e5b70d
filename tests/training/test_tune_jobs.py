"""A hyper-parameter tune job (issue #17 item 6) with the real parts: submitted into a booking,
started by reconcile on the real local executor, the real runner tuning Ultralytics on the demo
dataset (three iterations of one epoch), its reports reaching the live web app. The first slot
ends in the middle of the tune; the job moves to the next booking by itself and the tune goes
on from the next unfinished iteration. Then the pages: the fitness curve, and the one click that
turns the best values into a new job."""

import datetime as dt

import pytest
import yaml
from django.contrib.auth import get_user_model

from gpus.models import Gpu, Node
from reservations.models import Membership, Team
from reservations.services import reservation_create
from tests.support import client_for, wait_for
from training.executors.local import DEFAULT_INHERIT_ENV, LocalConfig, LocalExecutor
from training.models import Run, RunMetric, TrainingImage, TrainingJob
from training.reconcile import reconcile
from training.run_state import run_handle
from training.runner.dataset import make_demo_dataset
from training.services import job_submit

pytestmark = [pytest.mark.training, pytest.mark.django_db(transaction=True)]
H = dt.timedelta(hours=1)
GRACE = 60
BATCH_DELAY_ENV = "GPUBOOK_RUNNER_BATCH_DELAY_S"
SPACE = {"lr0": [0.0001, 0.01], "momentum": [0.6, 0.98]}




def iterations_of(run):
    return list(RunMetric.objects.filter(run=run, event="iteration").order_by("id").values_list("epoch", flat=True))


def test_a_tune_job_spans_two_bookings_and_its_best_values_become_a_new_job(live_server, settings, tmp_path,
                                                                            monkeypatch):
    settings.GPUBOOK_BASE_URL = live_server.url
    settings.GPUBOOK_DATA_ROOTS = [str(tmp_path / "data")]
    settings.GPUBOOK_RUNS_DIR = tmp_path / "runs"
    settings.GPUBOOK_RUNNER_WORKERS = 0
    settings.GPUBOOK_STOP_GRACE_SECONDS = GRACE
    monkeypatch.setenv(BATCH_DELAY_ENV, "0.3")  # so the slot's end lands inside an iteration
    data_yaml = make_demo_dataset(tmp_path / "data" / "shapes", train_images=8, val_images=4, imgsz=64, seed=3)
    TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")
    gpu = Gpu.objects.create(node=Node.objects.create(name="ws"), index=0, model_name="CPU stand-in", memory_mib=1024)
    team = Team.objects.create(name="vision", slug="vision", monthly_gpu_hours=100)
    user = get_user_model().objects.create_user(username="alice")
    Membership.objects.create(team=team, user=user)
    start = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0) + dt.timedelta(days=1)
    first = reservation_create(user=user, team=team, gpu_ids=[gpu.pk], start=start, end=start + H, now=start - H)
    second = reservation_create(user=user, team=team, gpu_ids=[gpu.pk], start=start + 3 * H, end=start + 4 * H,
                                now=start - H)
    yolo = {"model": "yolov8n.yaml", "data": str(data_yaml), "epochs": 1, "imgsz": 64, "batch": 4,
            "extra": {"lr0": 0.005}}
    job = job_submit(user=user, now=start - H, reservation_id=first.pk, document={
        "task_name": "shapes-tune", "image": "yolo:v8n-cu118", "team": "vision", "yolo": yolo,
        "tune": {"iterations": 3, "space": SPACE},
    })
    assert job.epochs_total == 3 and job.parsed_spec["tune"] == {"iterations": 3, "space": SPACE}
    executor = LocalExecutor(LocalConfig(
        state_dir=tmp_path / "executor", inherit_env=(*DEFAULT_INHERIT_ENV, BATCH_DELAY_ENV),
    ))

    def ended(run):
        return next((o for o in executor.observe() if o.run_id == run.pk and o.state.ended), None)

    try:
        # Slot 1: the first iteration finishes, then the slot ends.
        assert reconcile(now=start, executor=executor).started
        run1 = Run.objects.get()
        wait_for(lambda: iterations_of(run1), "the first iteration", timeout=300)
        assert reconcile(now=start + H - dt.timedelta(seconds=GRACE), executor=executor).stopped == [run1.pk]
        wait_for(lambda: ended(run1), "the first run to checkpoint", timeout=120)
        reconcile(now=start + H - dt.timedelta(seconds=30), executor=executor)
        run1.refresh_from_db()
        assert run1.state == Run.State.CHECKPOINTED, executor.log_tail(run_handle(run1), 100)
        assert reconcile(now=start + H, executor=executor).continued == {job.pk: second.pk}
        done = iterations_of(run1)
        assert done == list(range(1, len(done) + 1)) and len(done) < 3

        # Slot 2: the tune goes on with the next iteration and finishes.
        assert reconcile(now=start + 3 * H, executor=executor).started
        run2 = Run.objects.exclude(pk=run1.pk).get()
        observed = wait_for(lambda: ended(run2), "the second run to finish", timeout=300)
        report = reconcile(now=start + 3 * H + dt.timedelta(minutes=20), executor=executor)
        assert report.ended == [run2.pk], executor.log_tail(observed.handle, 100)
    finally:
        for observed in executor.observe():
            if not observed.state.ended:
                executor.kill(observed.handle)

    run2.refresh_from_db()
    job.refresh_from_db()
    assert run2.state == Run.State.SUCCEEDED and job.state == TrainingJob.State.SUCCEEDED
    assert iterations_of(run2) == list(range(len(done) + 1, 4))  # continued, not restarted
    assert job.epochs_done == 3  # the progress of a tune counts iterations
    assert {"best.pt", "best_hyperparameters.yaml", "tune_results.ndjson"} <= set(
        run2.artifacts.values_list("name", flat=True))
    reported = [m.values for m in RunMetric.objects.filter(run__job=job, event="iteration").order_by("epoch")]
    best = max(reported, key=lambda values: (values["fitness"], -values["iteration"]))
    best_values = {"lr0": best["hyp.lr0"], "momentum": best["hyp.momentum"]}
    assert reported[0]["hyp.lr0"] == 0.005  # the first iteration is the spec's own values

    # The run page draws the fitness curve over all three iterations.
    browser = client_for(user)
    page = browser.get(f"/runs/{run2.pk}/")
    assert page.status_code == 200
    series = page.context["tune"]["series"]
    assert series["iterations"] == [1, 2, 3] and series["fitness"] == [v["fitness"] for v in reported]
    assert 'id="chart-tune"' in page.content.decode() and 'id="tune-series"' in page.content.decode()

    # One click: the job page's button opens the submit form filled with the best values.
    job_page = browser.get(f"/jobs/{job.pk}/").content.decode()
    assert f'href="/jobs/?from_tune={job.pk}#spec_yaml"' in job_page and "Train with these values" in job_page
    assert "iteration 3/3" in job_page
    form = browser.get(f"/jobs/?from_tune={job.pk}")
    text = form.context["spec_yaml"]
    document = yaml.safe_load(text)
    assert "tune" not in document and document["task_name"] == "shapes-tune-tuned"
    assert document["yolo"]["extra"] == {"lr0": best_values["lr0"], "momentum": best_values["momentum"],
                                         "optimizer": "AdamW"}
    assert browser.get(f"/api/v1/jobs/{job.pk}/tuned-spec/").json()["spec"] == document

    submitted = browser.post("/jobs/", {"spec_yaml": text, "reservation": ""})
    assert submitted.status_code == 302
    tuned = TrainingJob.objects.exclude(pk=job.pk).get()
    assert tuned.parsed_spec["tune"] is None and tuned.epochs_total == 1
    assert tuned.parsed_spec["yolo"]["extra"] == {**best_values, "optimizer": "AdamW"}
