"""The trainer image catalog: `images list` shows tag and digest; `images pin` asks the
registry which manifest each tag points to now and stores that digest, so runs pull
`repository@sha256:…` and a retagged image cannot change what runs.

    manage.py images list
    manage.py images pin                 # every allowed image
    manage.py images pin yolo:v8n-cu118  # some
    manage.py images pin --plain-http    # a registry without TLS (loopback, a lab)
    manage.py images configmap | kubectl apply -f -   # the catalog the admission policy reads

Credentials: --username, and the password from $GPUBOOK_REGISTRY_PASSWORD (never argv).
Images live at GPUBOOK_IMAGE_REGISTRY + name:tag.
"""

import os

import yaml
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from training.models import TrainingImage
from training.oci_registry import RegistryError, resolve_digest


def catalog_configmap(*, namespace: str) -> dict:
    """Every allowed, pinned image exactly as runs name it (registry + name@digest), one per
    line; unpinned images are left out: the admission policy admits digests only."""
    pinned = [
        settings.GPUBOOK_IMAGE_REGISTRY + image.pinned_reference
        for image in TrainingImage.objects.filter(allowed=True).exclude(digest="")
    ]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "gpubook-image-catalog", "namespace": namespace,
                     "labels": {"app.kubernetes.io/part-of": "gpubook"}},
        "data": {"images": "\n".join(sorted(set(pinned)))},
    }


class Command(BaseCommand):
    help = "List the trainer image catalog, or pin its tags to the digests the registry serves."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list", help="name:tag, digest, allowed")
        configmap = sub.add_parser(
            "configmap", help="the ConfigMap deploy/kubernetes/admission-policy.yaml admits images from (YAML)"
        )
        configmap.add_argument("--namespace", default="gpubook")
        pin = sub.add_parser("pin", help="resolve digests from the registry and store them")
        pin.add_argument("images", nargs="*", help="name:tag (default: every allowed image)")
        pin.add_argument("--plain-http", action="store_true", help="the registry speaks HTTP, not HTTPS")
        pin.add_argument("--username", default="")
        pin.add_argument("--dry-run", action="store_true", help="show what would change, store nothing")

    def handle(self, *args, action: str, **options):
        if action == "list":
            for image in TrainingImage.objects.all():
                state = "allowed" if image.allowed else "not allowed"
                self.stdout.write(f"{image.reference}\t{image.digest or '(not pinned)'}\t{state}")
            return
        if action == "configmap":
            self.stdout.write(yaml.safe_dump(catalog_configmap(namespace=options["namespace"]), sort_keys=False))
            return
        self._pin(**options)

    def _pin(self, images, plain_http, username, dry_run, **_):
        catalog = TrainingImage.objects.filter(allowed=True)
        if images:
            wanted = set(images)
            catalog = [image for image in TrainingImage.objects.all() if image.reference in wanted]
            missing = wanted - {image.reference for image in catalog}
            if missing:
                raise CommandError(f"not in the catalog: {', '.join(sorted(missing))}")
        failures = []
        for image in catalog:
            reference = settings.GPUBOOK_IMAGE_REGISTRY + image.reference
            try:
                digest = resolve_digest(
                    reference, plain_http=plain_http, username=username,
                    password=os.environ.get("GPUBOOK_REGISTRY_PASSWORD", ""),
                )
            except RegistryError as error:
                failures.append(str(error))
                self.stderr.write(f"{image.reference}: {error}")
                continue
            if digest == image.digest:
                self.stdout.write(f"{image.reference}: {digest} (unchanged)")
                continue
            was = f" (was {image.digest})" if image.digest else ""
            self.stdout.write(f"{image.reference}: {digest}{was}{' [dry run]' if dry_run else ''}")
            if not dry_run:
                image.digest, image.pinned_at = digest, timezone.now()
                image.save(update_fields=["digest", "pinned_at"])
        if failures:
            raise CommandError(f"{len(failures)} image(s) could not be pinned")
