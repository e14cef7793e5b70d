"""Training pages: jobs list with progress, submit form, run detail with its curves and the
live partial, artifact downloads (never outside the run's folder), the model registry."""

import datetime as dt
import json

import pytest
import yaml
from django.test import Client
from django.utils import timezone

from training.models import Artifact, Run, RunMetric, TrainingImage, TrainingJob

H = dt.timedelta(hours=1)


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def finished(people, inventory, tmp_path):
    job = TrainingJob.objects.create(
        team=people["vision"], user=people["owner"], name="shapes", image=TrainingImage.objects.get(tag="v8n-cu118"),
        spec={"yolo": {}}, submitted_at=timezone.now() - 2 * H, state=TrainingJob.State.SUCCEEDED, epochs_total=3,
        epochs_done=3,
    )
    (tmp_path / "train" / "weights").mkdir(parents=True)
    (tmp_path / "train" / "weights" / "best.pt").write_bytes(b"weights")
    (tmp_path / "secret.txt").write_text("not an artifact")
    run = Run.objects.create(job=job, kind="reserved", node=inventory["node_a"], gpu_ids=[inventory["a"][0].pk],
                             gpu_indices=[0], created_at=timezone.now() - H, started_at=timezone.now() - H,
                             ended_at=timezone.now(), must_end_by=timezone.now(), state=Run.State.SUCCEEDED,
                             output_dir=str(tmp_path / "train" / ".."))
    for epoch, loss, quality in [(1, 3.0, 0.1), (2, 2.0, 0.3), (3, 1.5, 0.42)]:
        RunMetric.objects.create(run=run, event="epoch", epoch=epoch, at=timezone.now(),
                                 values={"box_loss": loss, "mAP50": quality, "mAP50-95": quality / 2})
    RunMetric.objects.create(run=run, event="final", epoch=3, at=timezone.now(), values={"mAP50": 0.45, "mAP50-95": 0.21})
    Artifact.objects.create(run=run, name="best.pt", path="train/weights/best.pt", size_bytes=7, sha256="0" * 64,
                            created_at=timezone.now())
    Artifact.objects.create(run=run, name="evil", path="../../etc/passwd", size_bytes=1, sha256="0" * 64,
                            created_at=timezone.now())
    return run


@pytest.mark.django_db
def test_pages_need_login(finished):
    for url in ("/jobs/", f"/jobs/{finished.job_id}/", f"/runs/{finished.pk}/", "/models/"):
        assert Client().get(url).status_code == 302


@pytest.mark.django_db
def test_jobs_page_shows_progress(people, finished):
    page = logged_in(people["teammate"]).get("/jobs/").content.decode()
    assert "shapes" in page and "epoch 3/3" in page and 'aria-valuenow="3"' in page
    assert f"/jobs/{finished.job_id}/" not in logged_in(people["outsider"]).get("/jobs/").content.decode()


@pytest.mark.django_db
def test_submit_form(people, inventory, settings):
    settings.GPUBOOK_DATA_ROOTS = ["/data/{team}"]
    client = logged_in(people["owner"])
    spec = {"task_name": "from the form", "image": "yolo:v8n-cu118", "team": "vision",
            "yolo": {"model": "yolov8n.yaml", "data": "/data/vision/d.yaml", "epochs": 2}}
    response = client.post("/jobs/", {"spec_yaml": yaml.safe_dump(spec)})
    job = TrainingJob.objects.get(name="from the form")
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    spec["yolo"]["data"] = "/etc/passwd"
    bad = client.post("/jobs/", {"spec_yaml": yaml.safe_dump(spec)})
    assert bad.status_code == 400 and "yolo.data" in bad.content.decode()
    assert TrainingJob.objects.count() == 1


@pytest.mark.django_db
def test_cancel_needs_csrf_and_permission(people, inventory):
    job = TrainingJob.objects.create(team=people["vision"], user=people["owner"], name="queued one",
                                     image=TrainingImage.objects.get(tag="v8n-cu118"), spec={},
                                     submitted_at=timezone.now())
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(people["owner"])
    assert strict.post(f"/jobs/{job.pk}/cancel/").status_code == 403
    logged_in(people["teammate"]).post(f"/jobs/{job.pk}/cancel/")
    job.refresh_from_db()
    assert job.state == TrainingJob.State.QUEUED  # a teammate may not
    logged_in(people["owner"]).post(f"/jobs/{job.pk}/cancel/")
    job.refresh_from_db()
    assert job.state == TrainingJob.State.CANCELLED


@pytest.mark.django_db
def test_run_detail_carries_the_curves(people, finished):
    client = logged_in(people["owner"])
    page = client.get(f"/runs/{finished.pk}/").content.decode()
    raw = page.split('<script id="run-series" type="application/json">')[1].split("</script>")[0]
    series = json.loads(raw)
    assert series["epochs"] == [1, 2, 3] and series["box_loss"] == [3.0, 2.0, 1.5]
    assert series["mAP50"] == [0.1, 0.3, 0.42]
    partial = client.get(f"/runs/{finished.pk}/", HTTP_HX_REQUEST="true").content.decode()
    assert partial.startswith('<div id="run-live"') and "<html" not in partial
    assert logged_in(people["outsider"]).get(f"/runs/{finished.pk}/").status_code == 404


@pytest.mark.django_db
def test_artifact_download_stays_inside_the_run_folder(people, finished):
    client = logged_in(people["owner"])
    response = client.get(f"/runs/{finished.pk}/artifacts/best.pt")
    assert response.status_code == 200 and b"".join(response.streaming_content) == b"weights"
    assert client.get(f"/runs/{finished.pk}/artifacts/evil").status_code == 404
    assert logged_in(people["outsider"]).get(f"/runs/{finished.pk}/artifacts/best.pt").status_code == 404


@pytest.mark.django_db
def test_models_page_lists_best_weights_with_final_metrics(people, finished):
    page = logged_in(people["owner"]).get("/models/").content.decode()
    assert "shapes" in page and "0.450" in page and "0.210" in page and "best.pt" in page
    assert "shapes" not in logged_in(people["outsider"]).get("/models/").content.decode()
