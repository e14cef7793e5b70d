"""Print the Kubernetes Job a job spec would become, for an admin to review. Creates nothing."""

import datetime as dt
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from gpus.models import Node
from reservations.models import Team
from training.execution import kubernetes_config_from_settings
from training.executors.base import RunSpec
from training.executors.kubernetes import manifest_yaml
from training.jobspec import JobSpecError, load_document, parse_job_spec
from training.services import allowed_images, data_roots_for


class Command(BaseCommand):
    help = "Print the batch/v1 Job (YAML) that a job spec would be run as."

    def add_arguments(self, parser):
        parser.add_argument("--job-spec", type=Path, required=True)
        parser.add_argument("--gpus", type=int, help="override resources.gpu")
        parser.add_argument("--node", help="node name (default: the first node with enough GPUs)")
        parser.add_argument("--hours", type=float, default=2.0, help="slot length for activeDeadlineSeconds")

    def handle(self, *args, job_spec: Path, gpus: int | None, node: str | None, hours: float, **options):
        try:
            document = load_document(job_spec.read_text())
            team = Team.objects.get(slug=document.get("team") if isinstance(document, dict) else None)
            spec = parse_job_spec(document, allowed_images=set(allowed_images()), data_roots=data_roots_for(team),
                                  max_gpus=64)
        except OSError as error:
            raise CommandError(f"cannot read {job_spec}: {error}") from error
        except Team.DoesNotExist as error:
            raise CommandError("the spec's `team` names no team") from error
        except JobSpecError as error:
            raise CommandError(f"invalid job spec: {error}") from error
        count = gpus or spec.gpus
        nodes = Node.objects.filter(name=node) if node else Node.objects.all()
        chosen = next((candidate for candidate in nodes if candidate.gpus.count() >= count), None)
        if chosen is None:
            raise CommandError(f"no node with {count} GPUs")
        now = timezone.now()
        output_dir = Path(settings.GPUBOOK_RUNS_DIR) / team.slug / "job-PREVIEW"
        argv = (
            list(spec.command) if spec.command
            else ["python", "-m", "training.runner", "--spec", str(output_dir / "spec-run-PREVIEW.json")]
        )
        run_spec = RunSpec(
            run_id=1, image=settings.GPUBOOK_IMAGE_REGISTRY + spec.image, argv=tuple(argv), node_name=chosen.name,
            gpu_indices=tuple(range(count)), team=team.slug, job_id=1, must_end_by=now + dt.timedelta(hours=hours),
            grace_s=settings.GPUBOOK_STOP_GRACE_SECONDS, output_dir=str(output_dir), memory=spec.memory, cpu=spec.cpu,
        )
        self.stdout.write(manifest_yaml(run_spec, kubernetes_config_from_settings(), now))
