"""Print the Kubernetes Job a run is (or a job spec would be) launched as. Creates nothing.

It goes through the launch path itself (`training.launch.run_spec_for`), so the preview is
the launch: `--run` prints the very Job reconcile creates for that run."""

import datetime as dt
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from gpus.models import Node
from reservations.models import Team
from training.execution import kubernetes_config_from_settings
from training.executors.kubernetes import manifest_yaml
from training.jobspec import JobSpecError, load_document, parse_job_spec
from training.launch import new_run, run_spec_for
from training.models import Run, TrainingJob
from training.services import allowed_images, data_roots_for

PREVIEW_ID = 1  # stands for the ids a job spec not yet submitted does not have


class Command(BaseCommand):
    help = "Print the batch/v1 Job (YAML) that a run is, or a job spec would be, launched as."

    def add_arguments(self, parser):
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--run", type=int, help="a run's id: the Job reconcile launches for it")
        source.add_argument("--job-spec", type=Path, help="a job spec file not yet submitted")
        parser.add_argument("--gpus", type=int, help="override resources.gpu (with --job-spec)")
        parser.add_argument("--node", help="node name (default: the first node with enough GPUs)")
        parser.add_argument("--hours", type=float, default=2.0, help="slot length for activeDeadlineSeconds")
        parser.add_argument("--at", help="launch instant (ISO 8601); default: the run's start, or now")

    def handle(self, *args, run: int | None, job_spec: Path | None, gpus: int | None, node: str | None,
               hours: float, at: str | None, **options):
        now = parse_datetime(at) if at else None
        if at and now is None:
            raise CommandError(f"--at {at!r} is not an ISO 8601 date-time")
        if run is not None:
            found = Run.objects.select_related("job__image", "job__team", "node").filter(pk=run).first()
            if found is None:
                raise CommandError(f"no run #{run}")
            preview, now = found, now or found.started_at or timezone.now()
        else:
            now = now or timezone.now()
            preview = self._preview_run(job_spec, gpus=gpus, node=node, must_end_by=now + dt.timedelta(hours=hours),
                                        now=now)
        self.stdout.write(manifest_yaml(run_spec_for(preview), kubernetes_config_from_settings(), now))

    def _preview_run(self, path: Path, *, gpus: int | None, node: str | None, must_end_by, now) -> Run:
        try:
            document = load_document(path.read_text())
            team = Team.objects.get(slug=document.get("team") if isinstance(document, dict) else None)
            images = allowed_images()
            spec = parse_job_spec(document, allowed_images=set(images), data_roots=data_roots_for(team), max_gpus=64)
        except OSError as error:
            raise CommandError(f"cannot read {path}: {error}") from error
        except Team.DoesNotExist as error:
            raise CommandError("the spec's `team` names no team") from error
        except JobSpecError as error:
            raise CommandError(f"invalid job spec: {error}") from error
        count = gpus or spec.gpus
        nodes = Node.objects.filter(name=node) if node else Node.objects.all()
        chosen = next((candidate for candidate in nodes if candidate.gpus.count() >= count), None)
        if chosen is None:
            raise CommandError(f"no node with {count} GPUs")
        job = TrainingJob(pk=PREVIEW_ID, team=team, image=images[spec.image], name=spec.task_name,
                          parsed_spec=spec.as_dict(), gpus_needed=count, timeout_s=spec.timeout_s)
        run = new_run(job=job, gpus=list(chosen.gpus.order_by("index")[:count]), kind=Run.Kind.RESERVED, now=now,
                      must_end_by=must_end_by)
        run.pk = PREVIEW_ID
        return run
