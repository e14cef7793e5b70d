"""Run logs: kept in full at a run's end, searchable across a team's runs, and archived.

* ``run_log_collect``: read the ended run's whole log from its executor (the local log file,
  or the pod's log), write it gzip-compressed to the archive storage and its lines to
  ``RunLogLine`` for search. ``logs_collect(now)`` does it for every ended run without one
  (``manage.py archive_logs`` runs it first; the scheduler may call it each tick).
* ``log_search``: keyword search over the lines of the runs a person may see. A
  case-insensitive substring match (``icontains``: ILIKE on PostgreSQL, LIKE on SQLite), so it
  behaves the same on both databases and finds paths and error codes that a full-text
  tokenizer would split.
* ``logs_archive(now, days)``: log lines of runs ended more than ``days`` ago, GPU telemetry
  samples and notices (with their deliveries) older than that, each serialized with Django's
  serializers into a ``.json.gz`` on the archive storage, then deleted from the database.
  ``archive_restore`` loads one back: nothing is lost. The full ``.log.gz`` of each run is
  never deleted by the sweep.
"""

import datetime as dt
import gzip
import hashlib
import io
import json

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core import serializers
from django.core.files.base import ContentFile
from django.core.files.storage import FileSystemStorage, Storage
from django.db import transaction
from django.utils.module_loading import import_string

from gpus.models import GpuSample
from notifications.models import Delivery, Notice
from reservations.models import Team
from training.models import LogArchive, Run, RunLog, RunLogLine

LINE_BATCH = 1000
MAX_LINE_CHARS = 4000  # a progress bar without newlines must not become one 50 MB row


def archive_storage() -> Storage:
    if settings.GPUBOOK_ARCHIVE_STORAGE:
        return import_string(settings.GPUBOOK_ARCHIVE_STORAGE)()
    return FileSystemStorage(location=str(settings.GPUBOOK_ARCHIVE_DIR))


def _read_full_log(run: Run) -> str:
    from training.execution import executor_from_settings
    from training.run_state import run_handle

    handle = run_handle(run)
    if handle is None:
        return ""
    return executor_from_settings().log_tail(handle, lines=10**9)


def run_log_collect(*, run: Run, now: dt.datetime, text: str | None = None, storage: Storage | None = None) -> RunLog:
    """Keep an ended run's full log (``text``, or read from its executor). Idempotent."""
    existing = RunLog.objects.filter(run=run).first()
    if existing is not None:
        return existing
    text = _read_full_log(run) if text is None else text
    raw = text.encode("utf-8", errors="replace")
    compressed = gzip.compress(raw, mtime=0)
    storage = storage or archive_storage()
    name = storage.save(f"logs/run-{run.pk}.log.gz", ContentFile(compressed))  # no network in the transaction
    lines = text.splitlines()
    with transaction.atomic():
        for start in range(0, len(lines), LINE_BATCH):
            RunLogLine.objects.bulk_create(
                RunLogLine(run=run, number=start + offset + 1, text=line[:MAX_LINE_CHARS])
                for offset, line in enumerate(lines[start:start + LINE_BATCH])
            )
        return RunLog.objects.create(
            run=run, storage_name=name, size_bytes=len(raw), compressed_bytes=len(compressed),
            sha256=hashlib.sha256(raw).hexdigest(), line_count=len(lines), collected_at=now,
        )


def logs_collect(*, now: dt.datetime, storage: Storage | None = None) -> list[int]:
    """Collect the logs of every ended run that has none yet; returns their ids."""
    done = []
    for run in Run.objects.filter(ended_at__isnull=False, full_log__isnull=True).order_by("id")[:200]:
        run_log_collect(run=run, now=now, storage=storage)
        done.append(run.pk)
    return done


def run_log_text(*, log: RunLog, storage: Storage | None = None) -> str:
    """The kept full log, decompressed."""
    with (storage or archive_storage()).open(log.storage_name, "rb") as handle:
        return gzip.decompress(handle.read()).decode("utf-8")


def log_search(*, user: AbstractBaseUser, query: str, limit: int = 100) -> list[RunLogLine]:
    """Lines containing ``query`` (case-insensitive) in the runs of the person's teams."""
    query = (query or "").strip()
    if len(query) < 2:
        return []
    lines = RunLogLine.objects.select_related("run__job__team").filter(text__icontains=query[:200])
    if not user.is_superuser:
        lines = lines.filter(run__job__team__in=Team.objects.filter(memberships__user=user))
    return list(lines.order_by("-run_id", "number")[:limit])


# --- retention ---------------------------------------------------------------------------------


def _write_archive(*, storage: Storage, name: str, objects: list, kind: str, run: Run | None,
                   cutoff: dt.datetime, now: dt.datetime) -> LogArchive:
    body = json.dumps({"kind": kind, "older_than": cutoff.isoformat(),
                       "objects": json.loads(serializers.serialize("json", objects))})
    saved = storage.save(name, ContentFile(gzip.compress(body.encode("utf-8"), mtime=0)))
    return LogArchive.objects.create(kind=kind, run=run, storage_name=saved, row_count=len(objects),
                                     older_than=cutoff, archived_at=now)


def logs_archive(*, now: dt.datetime, days: int, storage: Storage | None = None) -> list[LogArchive]:
    """Move log lines, telemetry and notices older than ``days`` into archives; see the module."""
    storage = storage or archive_storage()
    cutoff = now - dt.timedelta(days=days)
    stamp = now.strftime("%Y%m%dT%H%M%S")
    made = []
    for run in Run.objects.filter(ended_at__lt=cutoff, log_lines__isnull=False).distinct().order_by("id"):
        with transaction.atomic():
            lines = list(RunLogLine.objects.filter(run=run).order_by("number"))
            made.append(_write_archive(storage=storage, name=f"archive/run-{run.pk}-lines-{stamp}.json.gz",
                                       objects=lines, kind=LogArchive.Kind.RUN_LOG, run=run, cutoff=cutoff, now=now))
            RunLogLine.objects.filter(pk__in=[line.pk for line in lines]).delete()
    with transaction.atomic():
        samples = list(GpuSample.objects.filter(minute__lt=cutoff).order_by("id"))
        if samples:
            made.append(_write_archive(storage=storage, name=f"archive/telemetry-{stamp}.json.gz", objects=samples,
                                       kind=LogArchive.Kind.TELEMETRY, run=None, cutoff=cutoff, now=now))
            GpuSample.objects.filter(pk__in=[sample.pk for sample in samples]).delete()
    with transaction.atomic():
        notices = list(Notice.objects.filter(occurred_at__lt=cutoff).order_by("occurred_at"))
        if notices:
            deliveries = list(Delivery.objects.filter(notice__in=notices).order_by("pk"))
            made.append(_write_archive(storage=storage, name=f"archive/notices-{stamp}.json.gz",
                                       objects=[*notices, *deliveries], kind=LogArchive.Kind.NOTICES, run=None,
                                       cutoff=cutoff, now=now))
            Notice.objects.filter(pk__in=[notice.pk for notice in notices]).delete()  # deliveries cascade
    return made


def archive_restore(*, archive: LogArchive, now: dt.datetime, storage: Storage | None = None) -> int:
    """Load an archive's rows back into the database (same ids); returns how many."""
    with (storage or archive_storage()).open(archive.storage_name, "rb") as handle:
        body = json.loads(gzip.decompress(handle.read()))
    count = 0
    with transaction.atomic():
        for item in serializers.deserialize("json", io.StringIO(json.dumps(body["objects"]))):
            item.save()
            count += 1
        LogArchive.objects.filter(pk=archive.pk).update(restored_at=now)
    return count
