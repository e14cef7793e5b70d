"""The job submit form in a real headless Chromium: the estimated start and the predicted
runtime appear before submitting, and follow the spec as it is edited (htmx)."""

import pytest
from playwright.sync_api import expect

from training.models import TrainingImage, TrainingJob

pytestmark = pytest.mark.e2e

SPEC = """task_name: quick-check
image: yolo:v8n-cu118
team: vision
command: [python, -c, pass]
resources: {gpu: 1}
estimated_duration: 30m
"""


def test_the_submit_form_shows_the_estimate_before_submitting(open_page, live_server, people, inventory, settings):
    settings.GPUBOOK_SINGLE_USER = True  # command jobs allowed on the local executor
    TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")
    page = open_page("alice")
    page.goto(f"{live_server.url}/jobs/")
    estimate = page.locator("#start-estimate")
    expect(estimate).to_contain_text("No estimate yet")  # the example spec's data path is not under a data root
    spec = page.get_by_label("Job spec (YAML or JSON)")
    spec.fill(SPEC)
    spec.press("Tab")  # leaving the field is a change: the estimate follows
    expect(estimate).to_contain_text("position 1 in the queue")
    expect(estimate).to_contain_text("Predicted runtime: 30 min (your estimate)")
    assert not TrainingJob.objects.exists()  # nothing was submitted
