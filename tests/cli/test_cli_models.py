"""`gpubook models …` and `gpubook tuned`: the registry and a tune's best values from the
terminal (issue #17), the real program against a live server."""

import json

import pytest
from django.utils import timezone

from tests.cli.test_cli_live import gpubook, json_of, login  # noqa: F401  (the fixture, reused)
from tests.training.test_registry import finished  # noqa: F401  (the fixture, reused)
from training.models import Run, RunMetric, TrainingImage, TrainingJob


@pytest.mark.django_db(transaction=True)
def test_promote_list_compare_and_download_from_the_terminal(gpubook, people, finished, tmp_path):  # noqa: F811
    first, second = finished(0.20), finished(0.25)
    login(gpubook, "alice")
    promoted = gpubook("models", "promote", str(first.pk), "pcb-defect")
    assert promoted.stdout.strip() == f"Run #{first.pk} is vision/pcb-defect v1."
    gpubook("models", "promote", str(second.pk), "pcb-defect", "--note", "more data")

    listed = json_of(gpubook("models", "list", "--json"))
    assert [(m["full_name"], m["latest_version"]) for m in listed] == [("vision/pcb-defect", 2)]
    table = gpubook("models", "versions", "vision/pcb-defect").stdout
    assert "v2" in table and "best.onnx" in table

    compared = json_of(gpubook("models", "compare", str(listed[0]["id"]), "1", "2", "--json"))
    assert compared["metrics"][0] == {"metric": "mAP50-95", "a": 0.2, "b": 0.25, "change": pytest.approx(0.05)}
    assert "+0.05" in gpubook("models", "compare", "vision/pcb-defect", "1", "2").stdout

    target = tmp_path / "v2.onnx"
    gpubook("models", "download", "vision/pcb-defect", "2", "best.onnx", "-o", str(target))
    assert target.read_bytes() == b"onnx %d" % second.pk
    missing = gpubook("models", "download", "vision/pcb-defect", "2", "best.engine", "-o", str(target), check=False)
    assert missing.returncode == 1 and "has no file 'best.engine'" in missing.stderr
    assert gpubook("models", "versions", "nlp/nothing", check=False).returncode != 0


@pytest.mark.django_db(transaction=True)
def test_tuned_writes_the_spec_of_a_tunes_best_values(gpubook, people, inventory, tmp_path):  # noqa: F811
    spec = {"task_name": "pcb-tune", "image": "yolo:v8n-cu118", "team": "vision",
            "yolo": {"model": "yolov8n.yaml", "data": "/data/vision/pcb/data.yaml", "epochs": 5},
            "tune": {"iterations": 2}}
    image, _ = TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")  # a flushed database has none
    job = TrainingJob.objects.create(
        team=people["vision"], user=people["owner"], name="pcb-tune", image=image,
        spec=spec, parsed_spec={"tune": {"iterations": 2, "space": None}}, submitted_at=timezone.now(),
        state=TrainingJob.State.SUCCEEDED,
    )
    run = Run.objects.create(job=job, kind="backfill", node=inventory["node_a"], gpu_ids=[], gpu_indices=[0],
                             created_at=timezone.now(), must_end_by=timezone.now(), state=Run.State.SUCCEEDED)
    for iteration, fitness, lr0 in ((1, 0.1, 0.01), (2, 0.3, 0.002)):
        RunMetric.objects.create(run=run, event="iteration", epoch=iteration, at=timezone.now(),
                                 values={"iteration": iteration, "fitness": fitness, "hyp.lr0": lr0})
    login(gpubook, "alice")
    target = tmp_path / "tuned.json"
    written = gpubook("tuned", str(job.pk), "-o", str(target))
    assert f"Iteration 2 (fitness 0.3) written to {target}" in written.stderr
    document = json.loads(target.read_text())
    assert "tune" not in document and document["yolo"]["extra"] == {"optimizer": "AdamW", "lr0": 0.002}
    refused = gpubook("tuned", "999999", check=False)
    assert refused.returncode == 1
