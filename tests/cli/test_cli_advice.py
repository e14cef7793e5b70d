"""`gpubook advise` and `gpubook submit` say the batch for the GPU before submitting (issue #17)."""

import pytest

from tests.cli.test_cli_live import gpubook, login  # noqa: F401  (the fixture, reused)
from training.models import TrainingImage


@pytest.mark.django_db(transaction=True)
def test_advise_and_submit_print_the_batch_for_the_gpu_and_warn(gpubook, people, inventory, tmp_path, settings):  # noqa: F811
    settings.GPUBOOK_DATA_ROOTS = [str(tmp_path / "data" / "{team}")]
    # The catalog row the migration seeds: an earlier live-server test's flush may have removed it.
    TrainingImage.objects.update_or_create(name="yolo", tag="v8n-cu118", defaults={
        "recommended_batch": {"16384": 64, "24576": 96, "40960": 128, "81920": 256}})
    data = tmp_path / "data" / "vision" / "d.yaml"
    login(gpubook, "alice")
    job_file = tmp_path / "job.yaml"
    job_file.write_text(f"task_name: pcb\nimage: yolo:v8n-cu118\nteam: vision\n"
                        f"yolo: {{model: yolov8n.yaml, data: {data}, epochs: 3}}\n")
    # The inventory's smallest GPU is an L40S, 46068 MiB: the 40 GB row of the image's table.
    advised = gpubook("advise", str(job_file))
    assert "Recommended: batch 128 for a 45 GB GPU with this model" in advised.stdout
    assert "It trains with batch 128 (table), 3 epochs" in advised.stdout

    job_file.write_text(job_file.read_text().replace("epochs: 3", "epochs: 3, batch: 999"))
    submitted = gpubook("submit", str(job_file))
    assert "warning: batch 999 is more than the 128 this image recommends for a 45 GB GPU" in submitted.stderr
    assert "Submitted job #" in submitted.stdout
