"""No stored XSS: the report endpoint takes numbers and plain names only; what pages embed goes
through json_script; every page carries a Content-Security-Policy without inline script."""

import datetime as dt
import re

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from training.models import Artifact, Run, RunMetric, TrainingImage, TrainingJob

H = dt.timedelta(hours=1)
PAYLOAD = "</script><script>alert(1)</script>"


@pytest.fixture
def live_run(people, inventory):
    job = TrainingJob.objects.create(
        team=people["vision"], user=people["owner"], name="j", image=TrainingImage.objects.get(tag="v8n-cu118"),
        spec={}, submitted_at=timezone.now(), state=TrainingJob.State.RUNNING, epochs_total=3,
    )
    run = Run(job=job, kind="backfill", node=inventory["node_a"], gpu_ids=[inventory["a"][0].pk], gpu_indices=[0],
              created_at=timezone.now(), must_end_by=timezone.now() + H, state=Run.State.RUNNING,
              started_at=timezone.now())
    token = run.issue_report_token()
    run.save()
    return run, token


def report(run_id, token, body):
    return APIClient().post(f"/api/v1/runs/{run_id}/report/", body, format="json",
                            HTTP_AUTHORIZATION=f"Bearer {token}")


def artifact(**changes):
    return {"name": "best.pt", "path": "train/weights/best.pt", "size": 1, "sha256": "ab" * 32, **changes}


@pytest.mark.django_db
@pytest.mark.parametrize(
    "body",
    [
        {"event": "epoch", "epoch": 1, "metrics": {"box_loss": PAYLOAD}},
        {"event": "epoch", "epoch": 1, "metrics": {PAYLOAD: 1.0}},
        {"event": "epoch", "epoch": 1, "metrics": {"x" * 65: 1.0}},
        {"event": "epoch", "epoch": 1, "metrics": {f"m{i}": 1.0 for i in range(65)}},
        {"event": "epoch", "epoch": 1, "metrics": {"box_loss": True}},
        {"event": "epoch", "epoch": 1, "metrics": {"box_loss": 10**400}},
        {"event": "epoch", "epoch": 1, "metrics": {"box_loss": [1]}},
        {"event": "epoch", "epoch": 2147483648},
        {"event": "epoch", "epoch": 1.5},
        {"event": "artifacts", "epoch": 3, "detail": {"artifacts": [artifact(name="../evil")]}},
        {"event": "artifacts", "epoch": 3, "detail": {"artifacts": [artifact(name="a/b")]}},
        {"event": "artifacts", "epoch": 3, "detail": {"artifacts": [artifact(name="..")]}},
        {"event": "artifacts", "epoch": 3, "detail": {"artifacts": [artifact(size=2**63)]}},
        {"event": "artifacts", "epoch": 3, "detail": {"artifacts": [artifact(size=1e300)]}},
        {"event": "artifacts", "epoch": 3, "detail": {"artifacts": [artifact(sha256="zz")]}},
        {"event": "artifacts", "epoch": 3, "detail": {"artifacts": "all"}},
    ],
)
def test_report_refuses_what_is_not_a_number_or_a_plain_name(live_run, body):
    run, token = live_run
    response = report(run.pk, token, body)
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "invalid_report"
    assert not RunMetric.objects.filter(run=run).exists() and not Artifact.objects.filter(run=run).exists()


@pytest.mark.django_db
def test_report_size_1e400_in_raw_json_is_a_400(live_run):
    run, token = live_run
    raw = '{"event": "artifacts", "epoch": 3, "detail": {"artifacts": [{"name": "a", "path": "p", "size": 1e400,' \
          ' "sha256": "' + "ab" * 32 + '"}]}}'
    response = APIClient().generic("POST", f"/api/v1/runs/{run.pk}/report/", raw, content_type="application/json",
                                   HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 400 and response.json()["code"] in {"invalid_report", "malformed_request"}


@pytest.mark.django_db
def test_report_token_is_refused_once_the_run_has_ended(live_run):
    run, token = live_run
    assert report(run.pk, token, {"event": "epoch", "epoch": 1, "metrics": {"mAP50": 0.1}}).status_code == 202
    Run.objects.filter(pk=run.pk).update(state=Run.State.SUCCEEDED, ended_at=timezone.now())
    response = report(run.pk, token, {"event": "epoch", "epoch": 2, "metrics": {"mAP50": 0.2}})
    assert response.status_code == 409 and response.json()["code"] == "run_ended"
    artifacts = {"event": "artifacts", "epoch": 3, "detail": {"artifacts": [artifact()]}}
    assert report(run.pk, token, artifacts).status_code == 409
    assert RunMetric.objects.filter(run=run).count() == 1 and not Artifact.objects.exists()


@pytest.mark.django_db
def test_wrong_token_and_missing_run_look_the_same(live_run):
    run, _ = live_run
    wrong = report(run.pk, "guess", {"event": "epoch", "epoch": 1})
    missing = report(run.pk + 1000, "guess", {"event": "epoch", "epoch": 1})
    assert wrong.status_code == missing.status_code == 404 and wrong.json() == missing.json()


@pytest.mark.django_db
def test_run_page_embeds_series_through_json_script(people, live_run):
    run, _ = live_run
    # A row as an unvalidated endpoint could have stored it.
    RunMetric.objects.create(run=run, event="epoch", epoch=1, at=timezone.now(), values={"box_loss": PAYLOAD})
    client = Client()
    client.force_login(people["owner"])
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert PAYLOAD not in page
    assert page.count("</script>") == len(re.findall(r"<script\b", page))  # no script closed early
    assert '<script id="run-series" type="application/json">' in page
    assert "\\u003C/script\\u003E" in page


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/accounts/login/", "/calendar/", "/reports/quota/", "/reports/idle/",
                                  "/reports/utilization/", "/jobs/", "/api/docs/", "/api/v1/gpus/"])
def test_every_page_has_a_strict_policy_and_no_inline_script(people, inventory, path):
    client = Client()
    client.force_login(people["owner"])
    response = client.get(path)
    assert response.status_code == 200
    policy = response["Content-Security-Policy"]
    script_src = re.search(r"script-src ([^;]*)", policy).group(1).split()
    assert script_src == ["'self'"]
    assert "object-src 'none'" in policy and "frame-ancestors 'none'" in policy
    if response["Content-Type"].startswith("text/html"):
        html = response.content.decode()
        for tag in re.findall(r"<script\b[^>]*>", html):
            assert "src=" in tag or 'type="application/json"' in tag, tag
        assert not re.search(r"\son[a-z]+\s*=", html), "inline event handler"
        assert "cdn." not in html and "https://" not in html.split("<body", 1)[0]
