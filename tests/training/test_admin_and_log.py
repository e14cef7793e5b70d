"""The training admin pages, and the run log as a terminal would show it."""

import datetime as dt

import pytest
from django.utils import timezone

from training.models import Run, TrainingImage, TrainingJob
from training.terminal_log import render_terminal_text


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain\nlines\n", "plain\nlines\n"),
        ("\x1b[1;34mEpoch\x1b[0m 1/3", "Epoch 1/3"),
        # A progress bar redrawn with carriage returns appears once, in its last state.
        ("  1/3  10%|#   |\r  1/3  50%|##  |\r  1/3 100%|####|\nnext", "  1/3 100%|####|\nnext"),
        # Shorter text over longer leaves the tail, as on a screen, unless the line is erased.
        ("abcdef\rXY", "XYcdef"), ("abcdef\rXY\x1b[K", "XY"), ("abc\x1b[2K\rZ", "Z"),
        ("windows\r\nline", "windows\nline"),
        ("\x1b]0;window title\x07done\x07!", "done!"),
        ("ab\bc", "ac"),
        ("trailing cr\r", "trailing cr"),
    ],
)
def test_render_terminal_text(raw, shown):
    assert render_terminal_text(raw) == shown


@pytest.fixture
def run(people, inventory):
    image, _ = TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")
    now = timezone.now()
    job = TrainingJob.objects.create(team=people["vision"], user=people["owner"], name="detector", image=image,
                                     spec={}, submitted_at=now)
    gpu = inventory["a"][0]
    return Run.objects.create(job=job, kind=Run.Kind.BACKFILL, node=gpu.node, gpu_ids=[gpu.pk],
                              gpu_indices=[0], created_at=now, must_end_by=now + dt.timedelta(hours=1))


@pytest.mark.django_db
def test_admin_pages_for_images_jobs_runs(client, people, run):
    client.force_login(people["admin"])
    assert client.get("/admin/training/").status_code == 200
    for path in ("trainingimage", "trainingjob", "run", "runmetric"):
        assert client.get(f"/admin/training/{path}/").status_code == 200, path
    assert client.get(f"/admin/training/trainingjob/{run.job_id}/change/").status_code == 200
    page = client.get(f"/admin/training/run/{run.pk}/change/").content.decode()
    assert "report_token_hash" not in page
    assert client.get("/admin/training/trainingjob/add/").status_code == 403  # the services create jobs
    client.force_login(people["owner"])  # not staff
    assert client.get("/admin/training/").status_code == 302


@pytest.mark.django_db
def test_run_page_shows_the_log_as_a_terminal_would(client, people, run, settings):
    from training.executors.base import Handle, run_name

    run.handle = Handle(run_id=run.pk, name=run_name(run.pk), executor="local").as_dict()
    run.save(update_fields=["handle"])
    log = settings.VAR_DIR / "executor" / "logs" / f"{run_name(run.pk)}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("\x1b[34mEpoch 1/3\x1b[0m\n  10%|#\r  60%|###\r 100%|#####\nsaved\n")
    client.force_login(people["owner"])
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "Epoch 1/3\n 100%|#####\nsaved" in page
    assert "\x1b" not in page and "60%" not in page
