"""Image defaults, batch advice for the booked GPU, save_period, and export formats (issue #17)."""

import datetime as dt

import pytest
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from gpus.models import Gpu, Node
from reservations.services import reservation_create
from tests.security.tokens import token_for
from training.jobspec import DEFAULT_SAVE_PERIOD, JobSpecError, parse_job_spec, resolve_yolo
from training.launch import runner_spec
from training.models import Run, TrainingImage, TrainingJob
from training.services import data_roots_for

H = dt.timedelta(hours=1)
V8N_TABLE = {"16384": 64, "24576": 96, "40960": 128, "81920": 256}  # as migration 0002 seeds it


def yolo(**changes):
    return {"model": "yolov8n.yaml", "data": "/data/vision/d.yaml", **changes}


class TestResolve:
    def test_batch_from_the_table_for_the_gpu_memory(self):
        resolved = resolve_yolo(yolo(), image_defaults={}, batch_table=V8N_TABLE, gpu_memory_mib=24564)
        # 24564 MiB (an RTX 4090) is under the 24576 row: the 16 GB row applies.
        assert resolved.batch == 64 and resolved.batch_source == "table"
        assert resolved.advice == "batch 64 for a 24 GB GPU with this model"
        exact = resolve_yolo(yolo(), image_defaults={}, batch_table=V8N_TABLE, gpu_memory_mib=24576)
        assert exact.batch == 96 and exact.advice == "batch 96 for a 24 GB GPU with this model"
        assert exact.warnings == ()

    def test_a_batch_above_the_table_is_kept_with_a_warning_in_words(self):
        resolved = resolve_yolo(yolo(batch=128), image_defaults={}, batch_table=V8N_TABLE, gpu_memory_mib=24576)
        assert resolved.batch == 128 and resolved.batch_source == "spec"
        assert resolved.warnings == (
            "batch 128 is more than the 96 this image recommends for a 24 GB GPU; it may run out of GPU memory "
            "(leave batch out to use 96, or use -1 for AutoBatch)",
        )
        autobatch = resolve_yolo(yolo(batch=-1), image_defaults={}, batch_table=V8N_TABLE, gpu_memory_mib=24576)
        assert autobatch.batch == -1 and autobatch.warnings == ()

    def test_several_gpus_multiply_the_per_gpu_batch(self):
        resolved = resolve_yolo(yolo(), image_defaults={}, batch_table=V8N_TABLE, gpu_memory_mib=81920, gpus=2)
        assert resolved.batch == 512
        assert resolved.advice == "batch 512 for 2 × 80 GB GPUs (256 per GPU) with this model"

    def test_image_defaults_fill_what_the_spec_leaves_out(self):
        defaults = {"epochs": 100, "imgsz": 320, "optimizer": "AdamW", "lr0": 0.002, "save_period": 5, "bogus": 1}
        resolved = resolve_yolo(yolo(epochs=7, extra={"lr0": 0.01}), image_defaults=defaults, batch_table={},
                                gpu_memory_mib=None)
        assert (resolved.epochs, resolved.imgsz) == (7, 320)
        assert resolved.extra == {"optimizer": "AdamW", "lr0": 0.01, "save_period": 5}  # "bogus" is no argument
        assert resolved.batch == 16 and resolved.batch_source == "fallback" and resolved.advice is None
        assert resolved.export == ("onnx",)

    def test_save_period_defaults_to_ten_epochs(self):
        resolved = resolve_yolo(yolo(), image_defaults={}, batch_table={}, gpu_memory_mib=None)
        assert resolved.extra["save_period"] == DEFAULT_SAVE_PERIOD == 10

    def test_a_broken_table_row_is_skipped(self):
        resolved = resolve_yolo(yolo(), image_defaults={}, batch_table={"lots": 9, "8192": "x", "16384": 32},
                                gpu_memory_mib=20000)
        assert resolved.batch == 32


class TestExportField:
    def parse(self, **changes):
        document = {"task_name": "t", "image": "yolo:v8n-cu118", "team": "vision", "yolo": yolo(**changes)}
        return parse_job_spec(document, allowed_images={"yolo:v8n-cu118"}, data_roots=["/data/vision"], max_gpus=4)

    def test_default_and_subsets(self):
        left_out = self.parse().yolo
        assert left_out.export is None  # the image's default, else onnx, when a run starts
        resolved = resolve_yolo(self.parse().as_dict()["yolo"], image_defaults={}, batch_table={}, gpu_memory_mib=None)
        assert resolved.export == ("onnx",)
        assert self.parse(export=["torchscript", "openvino", "torchscript"]).yolo.export == ("torchscript", "openvino")
        assert self.parse(export=[]).yolo.export == ()
        assert self.parse().yolo.batch is None  # from the table, at the run's start

    @pytest.mark.parametrize("export", [["tflite"], "onnx", [1]])
    def test_unknown_formats_are_refused(self, export):
        with pytest.raises(JobSpecError) as refused:
            self.parse(export=export)
        assert [field for field, _ in refused.value.problems] == ["yolo.export"]


@pytest.fixture
def cards(db, people, settings, tmp_path):
    """A node with two 24 GB NVIDIA cards and one with an AMD card."""
    settings.GPUBOOK_DATA_ROOTS = [str(tmp_path / "data" / "{team}")]
    nvidia = Node.objects.create(name="ws-4090")
    amd = Node.objects.create(name="ws-mi")
    return {
        "nvidia": nvidia, "amd": amd, "data": str(tmp_path / "data" / "vision" / "d.yaml"),
        "4090": [Gpu.objects.create(node=nvidia, index=i, model_name="NVIDIA GeForce RTX 4090", memory_mib=24576)
                 for i in range(2)],
        "mi": [Gpu.objects.create(node=amd, index=0, model_name="AMD Instinct MI210", memory_mib=65536)],
    }


def book(people, gpus):
    now = timezone.now()
    start = now.replace(minute=0, second=0, microsecond=0) + 30 * H
    return reservation_create(user=people["owner"], team=people["vision"], gpu_ids=[g.pk for g in gpus],
                              start=start, end=start + 2 * H, now=now)


def document(cards, **yolo_changes):
    return {"task_name": "pcb", "image": "yolo:v8n-cu118", "team": "vision",
            "yolo": {"model": "yolov8n.yaml", "data": cards["data"], "epochs": 3, **yolo_changes}}


def client_for(user):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_for(user)}")
    return client


@pytest.mark.django_db
class TestEngineAtSubmit:
    def submit(self, people, cards, reservation):
        return client_for(people["owner"]).post(
            "/api/v1/jobs/", {"spec": document(cards, export=["onnx", "engine"]), "reservation": reservation.pk},
            format="json",
        )

    def test_refused_when_the_bookings_node_has_no_nvidia_gpu(self, people, cards, settings):
        settings.GPUBOOK_RUNNER_DEVICE = "cuda"
        response = self.submit(people, cards, book(people, cards["mi"]))
        body = response.json()
        assert response.status_code == 400 and body["code"] == "engine_needs_nvidia"
        assert "node ws-mi" in body["detail"] and "AMD Instinct MI210" in body["detail"]
        assert body["problems"][0]["field"] == "yolo.export"
        assert TrainingJob.objects.count() == 0

    def test_accepted_on_an_nvidia_node(self, people, cards, settings):
        settings.GPUBOOK_RUNNER_DEVICE = "cuda"
        response = self.submit(people, cards, book(people, cards["4090"][:1]))
        assert response.status_code == 201, response.json()

    def test_refused_where_runs_train_on_the_cpu(self, people, cards, settings):
        settings.GPUBOOK_RUNNER_DEVICE = "cpu"
        response = self.submit(people, cards, book(people, cards["4090"][:1]))
        assert response.status_code == 400 and "trains on the CPU" in response.json()["detail"]


@pytest.mark.django_db
class TestSubmitForm:
    def post(self, client, cards, reservation, text, **extra):
        return client.post("/jobs/", {"spec_yaml": text, "reservation": reservation.pk, **extra})

    def spec_text(self, cards, batch_line=""):
        return (f"task_name: pcb\nimage: yolo:v8n-cu118\nteam: vision\n"
                f"yolo:\n  model: yolov8n.yaml\n  data: {cards['data']}\n  epochs: 3\n{batch_line}")

    def test_check_says_the_batch_for_the_booked_gpu(self, client, people, cards):
        client.force_login(people["owner"])
        reservation = book(people, cards["4090"][:1])
        page = self.post(client, cards, reservation, self.spec_text(cards), action="check")
        assert page.status_code == 200
        assert "batch 96 for a 24 GB GPU with this model" in page.content.decode()
        assert TrainingJob.objects.count() == 0

    def test_a_batch_above_the_table_warns_before_submit(self, client, people, cards):
        client.force_login(people["owner"])
        reservation = book(people, cards["4090"][:1])
        text = self.spec_text(cards, "  batch: 200\n")
        page = self.post(client, cards, reservation, text)
        assert page.status_code == 200 and TrainingJob.objects.count() == 0
        html = page.content.decode()
        assert "batch 200 is more than the 96 this image recommends for a 24 GB GPU" in html
        assert "Submit anyway" in html
        confirmed = self.post(client, cards, reservation, text, confirm="1")
        assert confirmed.status_code == 302 and TrainingJob.objects.get().spec["yolo"]["batch"] == 200

    def test_api_advice(self, people, cards):
        reservation = book(people, cards["4090"])
        response = client_for(people["owner"]).post(
            "/api/v1/jobs/advice/",
            {"spec": {**document(cards, batch=500), "resources": {"gpu": 2}}, "reservation": reservation.pk},
            format="json",
        )
        body = response.json()
        assert response.status_code == 200
        assert body["advice"] == "batch 192 for 2 × 24 GB GPUs (96 per GPU) with this model"
        assert body["warnings"] and "500 is more than the 192" in body["warnings"][0]


@pytest.mark.django_db
@override_settings(GPUBOOK_RUNNER_DEVICE="cuda")
def test_the_runs_spec_gets_the_images_defaults_and_the_table_batch(people, cards, tmp_path):
    image = TrainingImage.objects.get(tag="v8n-cu118")
    image.default_hyperparameters = {"imgsz": 320, "epochs": 50, "optimizer": "SGD", "save_period": 4}
    image.save()
    raw = document(cards, export=["onnx", "torchscript"], extra={"lr0": 0.02}, allow_gpu_count_change=True)
    parsed = parse_job_spec(raw, allowed_images={"yolo:v8n-cu118"}, data_roots=data_roots_for(people["vision"]),
                            max_gpus=2)
    job = TrainingJob.objects.create(
        team=people["vision"], user=people["owner"], name="j", image=image, submitted_at=timezone.now(),
        spec=raw, parsed_spec=parsed.as_dict(),
    )
    run = Run.objects.create(
        job=job, kind="backfill", node=cards["nvidia"], gpu_ids=[cards["4090"][0].pk], gpu_indices=[0],
        created_at=timezone.now(), must_end_by=timezone.now() + H, output_dir=str(tmp_path / "run"),
    )
    spec = runner_spec(run, "token")
    assert (spec["epochs"], spec["imgsz"], spec["batch"]) == (3, 320, 96)
    assert spec["export"] == ["onnx", "torchscript"]
    assert spec["extra"] == {"optimizer": "SGD", "save_period": 4, "lr0": 0.02}
    assert spec["allow_gpu_count_change"] is True
    # What the runner takes: its own strict parser accepts the same fields.
    from training.runner.spec import EXTRA_ARGS

    assert all(EXTRA_ARGS[key](value) for key, value in spec["extra"].items())
