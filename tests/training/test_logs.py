"""Run logs: kept compressed at the run's end, searchable across a team's runs with a link to
the run and line, and archived past retention to a storage backend and restored (issue #17).
Runs on SQLite and PostgreSQL alike (the search is a case-insensitive substring match)."""

import datetime as dt
import gzip
import hashlib

import pytest
from django.core.files.storage import FileSystemStorage
from django.core.management import call_command
from django.utils import timezone

from gpus.models import GpuSample
from notifications.models import Delivery, Notice
from training import logs
from training.models import LogArchive, Run, RunLog, RunLogLine, TrainingImage, TrainingJob

LOG = "\n".join([
    "Ultralytics 8.4.190 Python-3.11.7 torch-2.14.1 CPU",
    "      1/3      0G      3.449      4.078      4.001         14         64",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "gpubook-runner: checkpointed at epoch 2",
])


@pytest.fixture
def storage(tmp_path, settings):
    settings.GPUBOOK_ARCHIVE_DIR = tmp_path / "archive"
    return FileSystemStorage(location=str(tmp_path / "archive"))


@pytest.fixture
def make_run(people, inventory):
    image = TrainingImage.objects.get(tag="v8n-cu118")

    def make(team="vision", *, ended_days_ago=0):
        ended = timezone.now() - dt.timedelta(days=ended_days_ago)
        owner = people["owner"] if team == "vision" else people["outsider"]
        job = TrainingJob.objects.create(team=people[team], user=owner, name=f"job-{team}", image=image, spec={},
                                         submitted_at=ended, state=TrainingJob.State.FAILED)
        return Run.objects.create(job=job, kind="backfill", node=inventory["node_a"], gpu_ids=[], gpu_indices=[0],
                                  state=Run.State.FAILED, created_at=ended, must_end_by=ended, ended_at=ended)

    return make


@pytest.mark.django_db
def test_the_full_log_is_kept_compressed_with_its_lines(make_run, storage):
    run = make_run()
    kept = logs.run_log_collect(run=run, now=timezone.now(), text=LOG, storage=storage)
    assert kept.line_count == 4 and kept.sha256 == hashlib.sha256(LOG.encode()).hexdigest()
    assert kept.storage_name == f"logs/run-{run.pk}.log.gz"
    with storage.open(kept.storage_name, "rb") as handle:
        assert gzip.decompress(handle.read()).decode() == LOG
    assert logs.run_log_text(log=kept, storage=storage) == LOG
    assert kept.compressed_bytes < kept.size_bytes * 2
    assert list(RunLogLine.objects.filter(run=run).values_list("number", flat=True)) == [1, 2, 3, 4]
    assert logs.run_log_collect(run=run, now=timezone.now(), text="other", storage=storage) == kept  # idempotent


@pytest.mark.django_db
def test_collect_finds_ended_runs_without_a_log(make_run, storage):
    ended = make_run()
    assert logs.logs_collect(now=timezone.now(), storage=storage) == [ended.pk]  # never started: an empty log
    assert RunLog.objects.get(run=ended).line_count == 0
    assert logs.logs_collect(now=timezone.now(), storage=storage) == []


@pytest.mark.django_db
def test_keyword_search_across_the_teams_runs_links_to_run_and_line(client, people, make_run, storage):
    mine, theirs = make_run("vision"), make_run("nlp")
    for run in (mine, theirs):
        logs.run_log_collect(run=run, now=timezone.now(), text=LOG, storage=storage)
    [hit] = logs.log_search(user=people["owner"], query="out of MEMORY")
    assert (hit.run_id, hit.number) == (mine.pk, 3)
    assert {line.run_id for line in logs.log_search(user=people["admin"], query="out of memory")} == {mine.pk, theirs.pk}
    assert logs.log_search(user=people["owner"], query="x") == []  # too short to mean anything

    client.force_login(people["owner"])
    page = client.get("/jobs/", {"q": "out of memory"}).content.decode()
    assert f'href="/runs/{mine.pk}/log/#L3"' in page and f"/runs/{theirs.pk}/log/" not in page
    log_page = client.get(f"/runs/{mine.pk}/log/").content.decode()
    assert 'id="L3"' in log_page and "CUDA out of memory" in log_page
    assert client.get(f"/runs/{theirs.pk}/log/").status_code == 404


@pytest.mark.django_db
def test_archive_moves_old_rows_to_storage_and_restore_brings_one_run_back(people, inventory, make_run, storage):
    now = timezone.now()
    old, recent = make_run(ended_days_ago=40), make_run(ended_days_ago=1)
    for run in (old, recent):
        logs.run_log_collect(run=run, now=now, text=LOG, storage=storage)
    minute = (now - dt.timedelta(days=40)).replace(second=0, microsecond=0)
    GpuSample.objects.create(gpu=inventory["a"][0], minute=minute, sample_count=6, utilization_mean=87.5)
    GpuSample.objects.create(gpu=inventory["a"][0], minute=now.replace(second=0, microsecond=0), sample_count=1)
    notice = Notice.objects.create(event_type="run.failed", team=people["vision"], occurred_at=now - dt.timedelta(days=40),
                                   payload={"run": old.pk})
    Delivery.objects.create(notice=notice, channel="email", user=people["owner"], target="alice@example.com",
                            next_attempt_at=notice.occurred_at, created_at=notice.occurred_at, state="delivered")
    before = list(RunLogLine.objects.filter(run=old).values_list("number", "text"))

    archives = logs.logs_archive(now=now, days=30, storage=storage)
    assert sorted(archive.kind for archive in archives) == ["notices", "run_log", "telemetry"]
    assert not RunLogLine.objects.filter(run=old).exists() and RunLogLine.objects.filter(run=recent).count() == 4
    assert GpuSample.objects.count() == 1 and not Notice.objects.exists() and not Delivery.objects.exists()
    assert RunLog.objects.filter(run=old).exists()  # the full .log.gz stays
    for archive in archives:
        assert storage.exists(archive.storage_name) and archive.storage_name.endswith(".json.gz")

    [run_archive] = [a for a in archives if a.kind == LogArchive.Kind.RUN_LOG]
    assert run_archive.run_id == old.pk and run_archive.row_count == 4
    assert logs.archive_restore(archive=run_archive, now=now, storage=storage) == 4
    assert list(RunLogLine.objects.filter(run=old).values_list("number", "text")) == before
    [notices] = [a for a in archives if a.kind == LogArchive.Kind.NOTICES]
    assert logs.archive_restore(archive=notices, now=now, storage=storage) == 2
    assert Notice.objects.get().payload == {"run": old.pk} and Delivery.objects.get().target == "alice@example.com"
    [telemetry] = [a for a in archives if a.kind == LogArchive.Kind.TELEMETRY]
    logs.archive_restore(archive=telemetry, now=now, storage=storage)
    assert GpuSample.objects.get(minute=minute).utilization_mean == 87.5
    assert logs.log_search(user=people["owner"], query="out of memory")[-1].run_id == old.pk


@pytest.mark.django_db
def test_the_command_collects_archives_and_restores(make_run, storage, capsys):
    run = make_run(ended_days_ago=10)
    logs.run_log_collect(run=run, now=timezone.now(), text=LOG, storage=storage)
    call_command("archive_logs", "--days", "5")
    archive = LogArchive.objects.get(kind="run_log")
    assert "archived 4 run_log row(s)" in capsys.readouterr().out
    call_command("archive_logs", "--restore", archive.storage_name)
    assert RunLogLine.objects.filter(run=run).count() == 4


def test_loki_configs_label_by_the_executors_pod_labels():
    """deploy/loki maps the Kubernetes executor's own pod labels (gpubook/run, …) to Loki labels."""
    import re
    from pathlib import Path

    import yaml

    from training.executors import kubernetes as k8s

    def meta(label: str) -> str:  # how Prometheus-style discovery spells a pod label
        return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)

    root = Path(__file__).resolve().parents[2] / "deploy" / "loki"
    promtail = yaml.safe_load((root / "promtail.yaml").read_text())
    rules = promtail["scrape_configs"][0]["relabel_configs"]
    mapped = {rule["source_labels"][0]: rule["target_label"] for rule in rules
              if rule.get("target_label") and len(rule.get("source_labels", [])) == 1}
    expected = {k8s.LABEL_RUN: "run", k8s.LABEL_JOB: "job", k8s.LABEL_TEAM: "team",
                k8s.LABEL_RESERVATION: "reservation", k8s.LABEL_INSTANCE: "instance"}
    for label, loki_label in expected.items():
        assert mapped[meta(label)] == loki_label
    keep = next(rule for rule in rules if rule.get("action") == "keep")
    assert keep["source_labels"] == [meta(k8s.LABEL_MANAGED_BY)] and keep["regex"] == k8s.MANAGED_BY
    alloy = (root / "alloy.river").read_text()
    assert f'label = "{k8s.LABEL_MANAGED_BY}={k8s.MANAGED_BY}"' in alloy
    for label, loki_label in expected.items():
        assert f'source_labels = ["{meta(label)}"]\n    target_label  = "{loki_label}"' in alloy
    assert f'regex         = "{k8s.CONTAINER_NAME}"' in alloy
