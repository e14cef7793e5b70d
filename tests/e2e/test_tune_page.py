"""In a real Chromium: a tune job's run page draws the fitness curve under the page's
Content-Security-Policy, and one click on "Train with these values" brings the submit form,
filled with the best values, which submits as a new job (issue #17 item 6)."""

import datetime as dt
import re

import pytest
import yaml
from django.utils import timezone

from training.models import Run, RunMetric, TrainingImage, TrainingJob

pytestmark = pytest.mark.e2e

H = dt.timedelta(hours=1)


@pytest.fixture
def tune_run(people, inventory, settings, tmp_path):
    settings.GPUBOOK_DATA_ROOTS = [str(tmp_path / "data" / "{team}")]
    image, _ = TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")  # flushed between browser tests
    spec = {"task_name": "pcb-tune", "image": "yolo:v8n-cu118", "team": "vision",
            "yolo": {"model": "yolov8n.yaml", "data": str(tmp_path / "data" / "vision" / "pcb.yaml"), "epochs": 5},
            "tune": {"iterations": 3}}
    job = TrainingJob.objects.create(
        team=people["vision"], user=people["owner"], name="pcb-tune", image=image, spec=spec,
        parsed_spec={"tune": {"iterations": 3, "space": None}}, submitted_at=timezone.now() - 2 * H,
        state=TrainingJob.State.SUCCEEDED, epochs_total=3, epochs_done=3,
    )
    run = Run.objects.create(job=job, kind="reserved", node=inventory["node_a"], gpu_ids=[inventory["a"][0].pk],
                             gpu_indices=[0], created_at=timezone.now() - H, started_at=timezone.now() - H,
                             ended_at=timezone.now(), must_end_by=timezone.now(), state=Run.State.SUCCEEDED)
    for iteration, fitness, lr0 in ((1, 0.11, 0.01), (2, 0.31, 0.0042), (3, 0.27, 0.0007)):
        RunMetric.objects.create(run=run, event="iteration", epoch=iteration, at=timezone.now(),
                                 values={"iteration": iteration, "fitness": fitness, "mAP50-95": fitness - 0.01,
                                         "hyp.lr0": lr0, "hyp.mosaic": 0.5})
    return run


def test_the_fitness_curve_and_the_one_click_to_a_tuned_job(open_page, live_server, tune_run, csp_violations):
    page = open_page("alice")
    page.set_default_timeout(30_000)  # plotly.min.js is 4 MB through the test server
    page.goto(f"{live_server.url}/runs/{tune_run.pk}/")
    page.wait_for_selector("#chart-tune .main-svg")  # drawn by the static script, under the policy
    assert page.locator("#chart-tune .scatterlayer .trace").count() == 3  # fitness, best so far, mAP50-95
    assert "iteration 2, fitness 0.31000" in page.locator("#tune-best").inner_text()

    page.get_by_role("link", name="Train with these values").click()
    page.wait_for_url(f"**/jobs/?from_tune={tune_run.job_id}*")
    document = yaml.safe_load(page.locator("#spec_yaml").input_value())
    assert "tune" not in document and document["yolo"]["extra"] == {"optimizer": "AdamW", "lr0": 0.0042, "mosaic": 0.5}

    page.get_by_role("button", name="Submit", exact=True).click()
    page.wait_for_url(re.compile(r"/jobs/\d+/"))  # the new job's page
    tuned = TrainingJob.objects.exclude(pk=tune_run.job_id).get()
    assert tuned.name == "pcb-tune-tuned" and tuned.parsed_spec["yolo"]["extra"]["lr0"] == 0.0042
