"""In a real Chromium: a metric stored with markup in it cannot run (json_script plus the
Content-Security-Policy), and the pages that draw charts still draw them with no violation."""

import datetime as dt

import pytest
from django.utils import timezone

from training.models import Run, RunMetric, TrainingImage, TrainingJob

pytestmark = pytest.mark.e2e

H = dt.timedelta(hours=1)
PAYLOAD = "</script><script>window.pwned = 1</script><img src=x onerror='window.pwned=2'>"


@pytest.fixture
def hostile_run(people, inventory):
    """A run whose stored metrics carry markup, as rows written before the report endpoint
    validated its input could."""
    # Browser tests flush the database between tests, catalog rows from migrations included.
    image, _ = TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")
    job = TrainingJob.objects.create(
        team=people["vision"], user=people["owner"], name=PAYLOAD, image=image,
        spec={"yolo": {}}, submitted_at=timezone.now() - 2 * H, state=TrainingJob.State.SUCCEEDED, epochs_total=2,
        epochs_done=2,
    )
    run = Run.objects.create(job=job, kind="reserved", node=inventory["node_a"], gpu_ids=[inventory["a"][0].pk],
                             gpu_indices=[0], created_at=timezone.now() - H, started_at=timezone.now() - H,
                             ended_at=timezone.now(), must_end_by=timezone.now(), state=Run.State.SUCCEEDED)
    for epoch in (1, 2):
        RunMetric.objects.create(run=run, event="epoch", epoch=epoch, at=timezone.now(),
                                 values={"box_loss": PAYLOAD, "mAP50": 0.2 * epoch, PAYLOAD: 1})
    return run


def test_stored_markup_in_metrics_does_not_run(open_page, live_server, hostile_run, csp_violations):
    page = open_page("alice")
    page.set_default_timeout(30_000)
    page.goto(f"{live_server.url}/runs/{hostile_run.pk}/")
    page.wait_for_selector("#chart-map .main-svg")  # the charts script ran and drew
    assert page.evaluate("window.pwned") is None
    assert page.locator("#run-series").count() == 1  # one data block: the payload did not close it


def test_report_pages_draw_their_charts_under_the_policy(open_page, live_server, people, inventory, csp_violations):
    page = open_page("alice")
    page.set_default_timeout(30_000)  # plotly.min.js is 4 MB through the test server
    response = page.goto(f"{live_server.url}/reports/quota/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    page.wait_for_selector("#quota-by-team .main-svg")
    page.goto(f"{live_server.url}/reports/utilization/")
    page.wait_for_selector("#utilization-heatmap .main-svg")
    page.goto(f"{live_server.url}/api/docs/")
    page.wait_for_selector(".swagger-ui .info")
