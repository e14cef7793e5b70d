"""The model registry: promote runs to "vision/pcb-defect" v1, v2…, list, compare, download."""

import hashlib

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from config.errors import Conflict, DomainError, NotFound
from tests.security.tokens import token_for
from training import registry
from training.models import Artifact, ModelVersion, Run, RunMetric, TrainingImage, TrainingJob


def client_for(user):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_for(user)}")
    return client


@pytest.fixture
def finished(people, inventory, tmp_path):
    """make(map50_95) -> a succeeded run of the vision team with best.pt and best.onnx on disk."""
    # get_or_create: a live-server test before this one flushes the rows the migration seeded.
    image, _ = TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")

    def make(map50_95: float, *, state=Run.State.SUCCEEDED):
        job = TrainingJob.objects.create(
            team=people["vision"], user=people["owner"], name="pcb", image=image, submitted_at=timezone.now(),
            spec={"task_name": "pcb", "yolo": {"model": "yolov8n.yaml", "data": "/data/vision/pcb/data.yaml"}},
            state=TrainingJob.State.SUCCEEDED,
        )
        run = Run.objects.create(
            job=job, kind="backfill", node=inventory["node_a"], gpu_ids=[], gpu_indices=[0], state=state,
            created_at=timezone.now(), must_end_by=timezone.now(), ended_at=timezone.now(),
        )
        out = tmp_path / f"run-{run.pk}"
        (out / "train" / "weights").mkdir(parents=True)
        Run.objects.filter(pk=run.pk).update(output_dir=str(out))
        run.refresh_from_db()
        for name, body in (("best.pt", b"weights %d" % run.pk), ("best.onnx", b"onnx %d" % run.pk)):
            (out / "train" / "weights" / name).write_bytes(body)
            Artifact.objects.create(run=run, name=name, path=f"train/weights/{name}", size_bytes=len(body),
                                    sha256=hashlib.sha256(body).hexdigest(), created_at=timezone.now())
        RunMetric.objects.create(run=run, event="epoch", epoch=3, values={"mAP50-95": 0.01}, at=timezone.now())
        RunMetric.objects.create(run=run, event="final", epoch=3, at=timezone.now(),
                                 values={"mAP50-95": map50_95, "mAP50": map50_95 * 2, "precision": 0.5, "note": "x"})
        return run

    return make


@pytest.mark.django_db
class TestPromote:
    def test_versions_count_up_with_metrics_data_and_spec(self, people, finished):
        first, second = finished(0.20), finished(0.25)
        v1 = registry.model_promote(run_id=first.pk, name="pcb-defect", actor=people["owner"], now=timezone.now())
        v2 = registry.model_promote(run_id=second.pk, name="pcb-defect", actor=people["teammate"], now=timezone.now(),
                                    note="more data")
        assert (str(v1), str(v2)) == ("vision/pcb-defect v1", "vision/pcb-defect v2")
        assert v2.metrics == {"mAP50-95": 0.25, "mAP50": 0.5, "precision": 0.5}  # the final figures, numbers only
        assert v2.data == "/data/vision/pcb/data.yaml" and v2.spec["task_name"] == "pcb"
        assert v1.weights_sha256 == hashlib.sha256(b"weights %d" % first.pk).hexdigest()

    def test_refusals(self, people, finished):
        run = finished(0.2)
        registry.model_promote(run_id=run.pk, name="pcb-defect", actor=people["owner"], now=timezone.now())
        with pytest.raises(Conflict, match="already a version"):
            registry.model_promote(run_id=run.pk, name="pcb-defect", actor=people["owner"], now=timezone.now())
        with pytest.raises(DomainError) as bad_name:
            registry.model_promote(run_id=run.pk, name="PCB Defect!", actor=people["owner"], now=timezone.now())
        assert bad_name.value.code == "invalid_name"
        with pytest.raises(NotFound):  # the outsider does not even learn the run exists
            registry.model_promote(run_id=run.pk, name="mine", actor=people["outsider"], now=timezone.now())
        failed = finished(0.3, state=Run.State.FAILED)
        with pytest.raises(Conflict, match="has not succeeded"):
            registry.model_promote(run_id=failed.pk, name="pcb-defect", actor=people["owner"], now=timezone.now())
        assert ModelVersion.objects.count() == 1

    def test_compare_side_by_side(self, people, finished):
        v1 = registry.model_promote(run_id=finished(0.20).pk, name="m", actor=people["owner"], now=timezone.now())
        v2 = registry.model_promote(run_id=finished(0.25).pk, name="m", actor=people["owner"], now=timezone.now())
        rows = registry.version_compare(a=v1, b=v2)
        assert [row["metric"] for row in rows] == ["mAP50-95", "mAP50", "precision"]
        assert rows[0]["a"] == 0.20 and rows[0]["b"] == 0.25 and rows[0]["change"] == pytest.approx(0.05)


@pytest.mark.django_db
class TestPages:
    def test_promote_list_compare_and_download(self, client, people, finished):
        first, second = finished(0.20), finished(0.25)
        client.force_login(people["owner"])
        assert client.post("/models/promote/", {"run": first.pk, "name": "pcb-defect"}).status_code == 302
        response = client.post("/models/promote/", {"run": second.pk, "name": "pcb-defect"})
        assert response.status_code == 302 and response["Location"] == "/models/vision/pcb-defect/"
        listing = client.get("/models/").content.decode()
        assert "vision/pcb-defect" in listing and "v2" in listing
        page = client.get("/models/vision/pcb-defect/?a=1&b=2").content.decode()
        assert "v1 and v2 side by side" in page and "+0.0500" in page
        download = client.get("/models/vision/pcb-defect/v1/best.onnx")
        assert download.status_code == 200 and b"".join(download.streaming_content) == b"onnx %d" % first.pk
        assert client.get("/models/vision/pcb-defect/v1/secret.txt").status_code == 404

    def test_outsider_sees_nothing(self, client, people, finished):
        registry.model_promote(run_id=finished(0.2).pk, name="pcb-defect", actor=people["owner"], now=timezone.now())
        client.force_login(people["outsider"])
        assert "pcb-defect" not in client.get("/models/").content.decode()
        assert client.get("/models/vision/pcb-defect/").status_code == 404
        assert client.get("/models/vision/pcb-defect/v1/best.pt").status_code == 404


@pytest.mark.django_db
class TestApi:
    def test_promote_list_versions_compare_download(self, people, finished):
        api = client_for(people["owner"])
        first, second = finished(0.20), finished(0.25)
        created = api.post("/api/v1/models/promote/", {"run": first.pk, "name": "pcb-defect"}, format="json")
        assert created.status_code == 201 and created.json()["version"] == 1
        assert {f["name"] for f in created.json()["files"]} == {"best.pt", "best.onnx"}
        api.post("/api/v1/models/promote/", {"run": second.pk, "name": "pcb-defect"}, format="json")
        listed = api.get("/api/v1/models/").json()
        assert listed == [{**listed[0], "full_name": "vision/pcb-defect", "latest_version": 2}]
        model = listed[0]["id"]
        versions = api.get(f"/api/v1/models/{model}/").json()
        assert [v["version"] for v in versions] == [2, 1]
        compared = api.get(f"/api/v1/models/{model}/compare/", {"a": 1, "b": 2}).json()
        assert compared["metrics"][0] == {"metric": "mAP50-95", "a": 0.2, "b": 0.25, "change": pytest.approx(0.05)}
        bad = api.get(f"/api/v1/models/{model}/compare/", {"a": "x", "b": 2})
        assert bad.status_code == 400 and bad.json()["code"] == "invalid_version"
        file = api.get(f"/api/v1/models/{model}/file/", {"version": 2, "name": "best.pt"})
        assert file.status_code == 200 and b"".join(file.streaming_content) == b"weights %d" % second.pk
        assert api.get(f"/api/v1/models/{model}/file/", {"version": 2, "name": "../x"}).status_code == 404

    def test_errors_have_the_one_shape(self, people, finished):
        run = finished(0.2)
        outsider = client_for(people["outsider"])
        refused = outsider.post("/api/v1/models/promote/", {"run": run.pk, "name": "x"}, format="json")
        assert refused.status_code == 404 and refused.json()["code"] == "not_found"
        registry.model_promote(run_id=run.pk, name="x", actor=people["owner"], now=timezone.now())
        model = registry.models_visible_to(user=people["owner"]).get().pk
        assert outsider.get(f"/api/v1/models/{model}/").status_code == 404
        assert outsider.get("/api/v1/models/").json() == []
        bad = client_for(people["owner"]).post("/api/v1/models/promote/", {"run": run.pk, "name": "Bad Name"},
                                              format="json")
        assert bad.status_code == 400 and bad.json()["code"] == "invalid_name"
