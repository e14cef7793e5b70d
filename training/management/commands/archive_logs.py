"""Keep ended runs' full logs, then archive log lines, telemetry and notices past retention.

    python manage.py archive_logs                 # GPUBOOK_LOG_RETENTION_DAYS (0: only collect)
    python manage.py archive_logs --days 30
    python manage.py archive_logs --restore archive/run-42-lines-20261201T010000.json.gz
"""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from training import logs
from training.models import LogArchive


class Command(BaseCommand):
    help = "Collect ended runs' logs and move rows older than the retention into compressed archives."

    def add_arguments(self, parser):
        parser.add_argument("--days", type=int, default=None, help="retention in days (default: the setting)")
        parser.add_argument("--restore", default=None, help="an archive's storage name to load back")

    def handle(self, *args, days=None, restore=None, **options):
        now = timezone.now()
        if restore:
            archive = LogArchive.objects.filter(storage_name=restore).first()
            if archive is None:
                raise CommandError(f"no archive {restore!r}")
            self.stdout.write(f"restored {logs.archive_restore(archive=archive, now=now)} rows from {restore}")
            return
        collected = logs.logs_collect(now=now)
        self.stdout.write(f"collected the full logs of {len(collected)} run(s)")
        days = settings.GPUBOOK_LOG_RETENTION_DAYS if days is None else days
        if days <= 0:
            return
        for archive in logs.logs_archive(now=now, days=days):
            self.stdout.write(f"archived {archive.row_count} {archive.kind} row(s) to {archive.storage_name}")
