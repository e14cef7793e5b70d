"""Job specs, the jobs/runs API, the runner's report endpoint, and the manifest preview."""

import datetime as dt
import io

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone
from rest_framework.test import APIClient

from reservations.services import reservation_create
from tests.support import client_for
from training.jobspec import JobSpecError, parse_job_spec
from training.models import Run, RunMetric, TrainingJob

H = dt.timedelta(hours=1)
ROOTS = ["/data/vision", "/data/shared"]
IMAGES = {"yolo:v8n-cu118"}


def spec(**changes):
    document = {
        "task_name": "detector", "image": "yolo:v8n-cu118", "team": "vision",
        "yolo": {"model": "yolov8n.yaml", "data": "/data/vision/shapes/data.yaml", "epochs": 3, "imgsz": 64, "batch": 4},
        "resources": {"gpu": 1, "memory": "32Gi", "cpu": 8}, "priority": "high", "timeout": "2h",
        "estimated_duration": "90m",
    }
    document.update(changes)
    return document


class TestJobSpec:
    def test_valid_spec(self):
        parsed = parse_job_spec(spec(), allowed_images=IMAGES, data_roots=ROOTS, max_gpus=4)
        assert parsed.gpus == 1 and parsed.timeout_s == 7200 and parsed.estimated_duration_s == 5400
        assert parsed.yolo.data == "/data/vision/shapes/data.yaml" and parsed.checkpointable

    @pytest.mark.parametrize(
        ("changes", "field"),
        [
            ({"image": "evil:latest"}, "image"),
            ({"resources": {"gpu": 9}}, "resources.gpu"),
            ({"yolo": {"model": "yolov8n.yaml", "data": "/data/nlp/secret.yaml"}}, "yolo.data"),
            ({"yolo": {"model": "yolov8n.yaml", "data": "/data/vision/../nlp/x.yaml"}}, "yolo.data"),
            ({"yolo": {"model": "yolov8n.yaml", "data": "/data/vision/d.yaml", "lr": 1}}, "yolo.lr"),
            ({"yolo": {"model": "yolov8n.yaml", "data": "/data/vision/d.yaml", "extra": {"rm": "-rf"}}}, "yolo.extra.rm"),
            ({"colour": "blue"}, "colour"),
            ({"yolo": None, "command": "python train.py && curl evil"}, "command"),
            ({"command": ["python", "train.py"]}, "command"),
            ({"priority": "asap"}, "priority"),
            ({"timeout": "forever"}, "timeout"),
            # Past what the column holds: once a 500 (found by tests/security/test_schema_conformance_cli.py).
            ({"estimated_duration": 254402543316}, "estimated_duration"),
            ({"timeout": "24856d"}, "timeout"),
            ({"resources": {"memory": "lots"}}, "resources.memory"),
            ({"tune": {"iterations": 0}}, "tune.iterations"),
            ({"tune": {"iterations": 3, "space": {"imgsz": [32, 640]}}}, "tune.space.imgsz"),
            ({"tune": {"iterations": 3, "space": {"lr0": [0.1, 0.01]}}}, "tune.space.lr0"),
            ({"tune": "fast"}, "tune"),
            ({"tune": {"iterations": 3}, "yolo": None, "command": ["python", "t.py"]}, "tune"),
            ({"tune": {"iterations": 3}, "resources": {"gpu": 2}}, "resources.gpu"),
            ({"tune": {"iterations": 3}, "yolo": {"model": "yolov8n.yaml", "data": "/data/vision/d.yaml",
                                                  "export": ["onnx"]}}, "yolo.export"),
        ],
    )
    def test_each_problem_names_its_field(self, changes, field):
        with pytest.raises(JobSpecError) as refused:
            parse_job_spec(spec(**changes), allowed_images=IMAGES, data_roots=ROOTS, max_gpus=4)
        assert field in [problem_field for problem_field, _ in refused.value.problems]

    def test_tune_job(self):
        parsed = parse_job_spec(spec(tune={"iterations": 5, "space": {"lr0": [1e-5, 0.1], "close_mosaic": [0, 10]}}),
                                allowed_images=IMAGES, data_roots=ROOTS, max_gpus=4)
        assert parsed.tune.iterations == 5 and parsed.checkpointable
        stored = parsed.as_dict()
        assert stored["tune"] == {"iterations": 5, "space": {"lr0": [1e-5, 0.1], "close_mosaic": [0, 10]}}
        # What launch reads back (JSON from the database) is the same spec.
        import json

        from training.jobspec import JobSpec

        assert JobSpec.from_dict(json.loads(json.dumps(stored))) == parsed
        assert parse_job_spec(spec(), allowed_images=IMAGES, data_roots=ROOTS, max_gpus=4).as_dict()["tune"] is None

    def test_all_problems_at_once(self):
        with pytest.raises(JobSpecError) as refused:
            parse_job_spec(spec(image="x", priority="x", extra_key=1), allowed_images=IMAGES, data_roots=ROOTS,
                           max_gpus=4)
        assert len(refused.value.problems) == 3

    def test_command_job(self):
        parsed = parse_job_spec(spec(yolo=None, command=["python", "train.py", "--fast"]), allowed_images=IMAGES,
                                data_roots=ROOTS, max_gpus=4)
        assert parsed.command == ("python", "train.py", "--fast") and not parsed.checkpointable


@pytest.fixture
def api_world(people, inventory, settings):
    settings.GPUBOOK_DATA_ROOTS = ["/data/{team}"]
    return {name: client_for(user, api=True) for name, user in people.items() if name not in {"vision", "nlp"}}


def submit(client, **changes):
    return client.post("/api/v1/jobs/", {"spec": spec(**changes)}, format="json")


@pytest.mark.django_db
class TestJobsApi:
    def test_submit_list_cancel(self, api_world, people):
        response = submit(api_world["owner"])
        assert response.status_code == 201, response.content
        job = response.json()
        assert job["state"] == "queued" and job["image"] == "yolo:v8n-cu118" and job["gpus_needed"] == 1
        assert [row["id"] for row in api_world["teammate"].get("/api/v1/jobs/").json()["results"]] == [job["id"]]
        assert api_world["outsider"].get("/api/v1/jobs/").json()["count"] == 0
        assert api_world["outsider"].get(f"/api/v1/jobs/{job['id']}/").status_code == 404
        assert api_world["teammate"].post(f"/api/v1/jobs/{job['id']}/cancel/").status_code == 403
        cancelled = api_world["owner"].post(f"/api/v1/jobs/{job['id']}/cancel/")
        assert cancelled.json()["state"] == "cancelled"
        assert api_world["owner"].post(f"/api/v1/jobs/{job['id']}/cancel/").json()["code"] == "already_finished"

    def test_submit_yaml(self, api_world):
        response = api_world["owner"].post("/api/v1/jobs/", {"spec_yaml": yaml.safe_dump(spec())}, format="json")
        assert response.status_code == 201
        broken = api_world["owner"].post("/api/v1/jobs/", {"spec_yaml": "task_name: [unclosed"}, format="json")
        assert broken.status_code == 400 and broken.json()["code"] == "invalid_spec"
        # one word is YAML too, but no spec: said so, not "no team None"
        word = api_world["owner"].post("/api/v1/jobs/", {"spec_yaml": "train"}, format="json")
        assert word.status_code == 400 and word.json()["problems"] == [
            {"field": "", "problem": "the spec must be a mapping of fields"}]

    def test_bad_spec_lists_problems(self, api_world):
        response = submit(api_world["owner"], image="docker.io/evil:latest", command="rm -rf /", yolo=None)
        body = response.json()
        assert response.status_code == 400 and body["code"] == "invalid_spec"
        assert {problem["field"] for problem in body["problems"]} == {"image", "command"}
        assert TrainingJob.objects.count() == 0

    def test_other_team_is_refused(self, api_world):
        response = submit(api_world["outsider"])
        assert response.status_code == 403 and response.json()["code"] == "not_team_member"

    def test_attach_and_detach(self, api_world, people, inventory):
        now = timezone.now()
        start = now.replace(minute=0, second=0, microsecond=0) + 30 * H
        reservation = reservation_create(user=people["owner"], team=people["vision"],
                                         gpu_ids=[g.pk for g in inventory["a"][:2]], start=start, end=start + H, now=now)
        other = reservation_create(user=people["outsider"], team=people["nlp"], gpu_ids=[inventory["a"][3].pk],
                                   start=start, end=start + H, now=now)
        job = submit(api_world["owner"]).json()
        url = f"/api/v1/jobs/{job['id']}/attach/"
        assert api_world["owner"].post(url, {"reservation": reservation.pk}, format="json").json()["reservation"] == reservation.pk
        refused = api_world["owner"].post(url, {"reservation": other.pk}, format="json")
        missing = api_world["owner"].post(url, {"reservation": other.pk + 1000}, format="json")
        assert refused.status_code == missing.status_code == 404 and refused.json()["code"] == "not_found"
        assert api_world["owner"].post(url, {"reservation": None}, format="json").json()["reservation"] is None


@pytest.fixture
def run(people, inventory):
    from training.models import TrainingImage

    job = TrainingJob.objects.create(
        team=people["vision"], user=people["owner"], name="j", image=TrainingImage.objects.get(tag="v8n-cu118"),
        spec={}, submitted_at=timezone.now(), state=TrainingJob.State.RUNNING, epochs_total=3,
    )
    run = Run(job=job, kind="backfill", node=inventory["node_a"], gpu_ids=[inventory["a"][0].pk], gpu_indices=[0],
              created_at=timezone.now(), must_end_by=timezone.now() + H, state=Run.State.RUNNING)
    token = run.issue_report_token()
    run.save()
    return run, token


@pytest.mark.django_db
class TestRunReports:
    def report(self, run_id, token, body):
        client = APIClient()
        return client.post(f"/api/v1/runs/{run_id}/report/", body, format="json", HTTP_AUTHORIZATION=f"Bearer {token}")

    def test_epoch_reports_build_the_series(self, run, api_world):
        run, token = run
        for epoch in (1, 2):
            response = self.report(run.pk, token, {"run_id": str(run.pk), "event": "epoch", "epoch": epoch, "epochs": 3,
                                                   "metrics": {"box_loss": 1.0 / epoch, "mAP50": 0.1 * epoch}})
            assert response.status_code == 202
        assert list(RunMetric.objects.filter(run=run).values_list("epoch", flat=True)) == [1, 2]
        run.job.refresh_from_db()
        assert run.job.epochs_done == 2
        detail = api_world["owner"].get(f"/api/v1/runs/{run.pk}/").json()
        assert [point["values"]["mAP50"] for point in detail["metrics"]] == [0.1, 0.2]

    def test_a_tune_counts_iterations_not_epochs(self, run):
        run, token = run
        TrainingJob.objects.filter(pk=run.job_id).update(parsed_spec={"tune": {"iterations": 3, "space": None}})
        assert self.report(run.pk, token, {"event": "epoch", "epoch": 1, "epochs": 1}).status_code == 202
        run.job.refresh_from_db()
        assert run.job.epochs_done == 0  # an epoch inside an iteration
        body = {"event": "iteration", "epoch": 2, "epochs": 3,
                "metrics": {"iteration": 2, "fitness": 0.25, "hyp.lr0": 0.001}}
        assert self.report(run.pk, token, body).status_code == 202
        run.job.refresh_from_db()
        assert run.job.epochs_done == 2

    def test_artifacts_are_registered(self, run):
        run, token = run
        body = {"event": "artifacts", "epoch": 3, "detail": {"artifacts": [
            {"name": "best.pt", "path": "train/weights/best.pt", "size": 123, "sha256": "ab" * 32}]}}
        assert self.report(run.pk, token, body).status_code == 202
        assert run.artifacts.get().size_bytes == 123

    def test_another_runs_token_is_refused(self, run, people, inventory):
        run, token = run
        other = Run.objects.create(job=run.job, kind="backfill", node=inventory["node_a"], gpu_ids=[], gpu_indices=[],
                                   created_at=timezone.now(), must_end_by=timezone.now(), state=Run.State.FAILED)
        response = self.report(other.pk, token, {"event": "epoch", "epoch": 1})
        assert response.status_code == 404 and response.json()["code"] == "not_found"
        assert self.report(run.pk, "guess", {"event": "epoch"}).status_code == 404
        assert self.report(2**31 + 5, "guess", {"event": "epoch"}).json() == response.json()
        assert APIClient().post(f"/api/v1/runs/{run.pk}/report/", {}, format="json").status_code == 403

    @pytest.mark.parametrize("body", [{"event": "nonsense"}, {"event": "epoch", "epoch": -1},
                                      {"event": "epoch", "metrics": [1, 2]}, ["not", "an", "object"]])
    def test_bad_reports_get_400(self, run, body):
        run, token = run
        response = self.report(run.pk, token, body)
        assert response.status_code == 400 and response.json()["code"] == "invalid_report"


@pytest.mark.django_db
def test_k8s_manifest_preview(people, inventory, tmp_path, settings):
    settings.GPUBOOK_DATA_ROOTS = ["/data/{team}"]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec()))
    out = io.StringIO()
    call_command("k8s_manifest", "--job-spec", str(path), stdout=out)
    (job,) = list(yaml.safe_load_all(out.getvalue()))
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert job["kind"] == "Job" and container["image"] == "yolo:v8n-cu118"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["nodeSelector"] == {"kubernetes.io/hostname": "node-a"}
    assert pod["automountServiceAccountToken"] is False and pod["securityContext"]["runAsNonRoot"] is True
    path.write_text(yaml.safe_dump(spec(image="evil:1")))
    with pytest.raises(CommandError, match="image"):
        call_command("k8s_manifest", "--job-spec", str(path), stdout=io.StringIO())
