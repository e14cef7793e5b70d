"""Images pinned by digest, against a real registry: Debian's `docker-registry` (the CNCF
distribution registry) serving the OCI distribution API on loopback, filled by `oras` pushing
small artifacts. `manage.py images pin` stores the digest the tag points to; the Job a run
becomes pulls repository@digest, so retagging in the registry changes nothing until an admin
pins again; the catalog admin shows tag and digest."""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
import warnings
from io import StringIO

import kubernetes_validate
import pytest
import yaml
from django.core.management import CommandError, call_command

from training.models import TrainingImage
from training.oci_registry import RegistryError, parse_image, resolve_digest

REGISTRY = shutil.which("docker-registry")
PINNED = "sha256:" + "0f" * 32
needs_registry = pytest.mark.skipif(
    REGISTRY is None and os.environ.get("CI") != "true",
    reason="needs Debian's docker-registry (make registry, or apt-get install docker-registry)",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """host:port of a registry on loopback, storage in a temporary directory."""
    assert REGISTRY, "docker-registry is not installed"
    root = tmp_path_factory.mktemp("registry")
    host = f"127.0.0.1:{free_port()}"
    config = root / "config.yml"
    config.write_text(
        f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
        f"  delete:\n    enabled: true\nhttp:\n  addr: {host}\n  secret: gpubook-test\n"
    )
    log = open(root / "registry.log", "wb")  # noqa: SIM115 (closed below)
    process = subprocess.Popen([REGISTRY, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while True:
        with contextlib.suppress(OSError), urllib.request.urlopen(f"http://{host}/v2/", timeout=1) as answer:
            if answer.status == 200:
                break
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            raise AssertionError((root / "registry.log").read_text())
        time.sleep(0.1)
    yield host
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=10)
    log.close()


def push(host: str, target: str, content: str, tmp_path) -> str:
    """Push a one-file artifact with oras; return the manifest digest the registry reported."""
    import oras.client

    path = tmp_path / "weights.txt"
    path.write_text(content)
    answer = oras.client.OrasClient(hostname=host, insecure=True).push(
        target=f"{host}/{target}", files=[str(path)], disable_path_validation=True, quiet=True
    )
    assert answer.status_code == 201
    return answer.headers["Docker-Content-Digest"]


@needs_registry
@pytest.mark.django_db
def test_pin_stores_the_digest_and_runs_pull_it_until_pinned_again(registry, tmp_path, settings):
    settings.GPUBOOK_IMAGE_REGISTRY = f"{registry}/gpubook/"
    TrainingImage.objects.all().delete()  # the seeded catalog: not in this registry
    image = TrainingImage.objects.create(name="yolo", tag="v8n-cu118")
    other = TrainingImage.objects.create(name="yolo", tag="v11s-cu121")
    first = push(registry, "gpubook/yolo:v8n-cu118", "first build", tmp_path)
    push(registry, "gpubook/yolo:v11s-cu121", "another image", tmp_path)
    assert image.pinned_reference == "yolo:v8n-cu118"  # unpinned: the tag

    out = StringIO()
    call_command("images", "pin", "--plain-http", "yolo:v8n-cu118", stdout=out)
    image.refresh_from_db()
    assert image.digest == first and image.pinned_at is not None
    assert image.pinned_reference == f"yolo@{first}"
    assert f"yolo:v8n-cu118: {first}" in out.getvalue()
    other.refresh_from_db()
    assert other.digest == ""  # only the named image

    # Someone retags: the pinned digest still names the first build.
    second = push(registry, "gpubook/yolo:v8n-cu118", "second build", tmp_path)
    assert second != first
    from training.execution import kubernetes_config_from_settings

    allowlist = kubernetes_config_from_settings().image_allowlist
    assert f"{registry}/gpubook/yolo@{first}" in allowlist
    assert f"{registry}/gpubook/yolo:v8n-cu118" not in allowlist  # the mutable tag cannot run

    out = StringIO()
    call_command("images", "pin", "--plain-http", stdout=out)  # every allowed image
    image.refresh_from_db()
    other.refresh_from_db()
    assert image.digest == second and f"(was {first})" in out.getvalue()
    assert other.digest.startswith("sha256:")
    out = StringIO()
    call_command("images", "list", stdout=out)
    assert f"yolo:v8n-cu118\t{second}\tallowed" in out.getvalue()


@needs_registry
@pytest.mark.django_db
def test_an_unknown_tag_or_unreachable_registry_is_an_error_in_words(registry, settings):
    settings.GPUBOOK_IMAGE_REGISTRY = f"{registry}/gpubook/"
    TrainingImage.objects.all().delete()
    TrainingImage.objects.create(name="yolo", tag="never-pushed")
    err = StringIO()
    with pytest.raises(CommandError, match="could not be pinned"):
        call_command("images", "pin", "--plain-http", stderr=err)
    assert "no such manifest" in err.getvalue()
    assert TrainingImage.objects.get().digest == ""
    with pytest.raises(RegistryError, match="unreachable"):
        resolve_digest(f"127.0.0.1:{free_port()}/gpubook/yolo:x", plain_http=True, timeout_s=2)


@needs_registry
def test_resolve_digest_matches_the_manifest_bytes(registry, tmp_path):
    digest = push(registry, "gpubook/check:v1", "bytes", tmp_path)
    assert resolve_digest(f"{registry}/gpubook/check:v1", plain_http=True) == digest
    request = urllib.request.Request(
        f"http://{registry}/v2/gpubook/check/manifests/v1",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
    )
    import hashlib

    with urllib.request.urlopen(request) as answer:  # noqa: S310
        assert "sha256:" + hashlib.sha256(answer.read()).hexdigest() == digest


@pytest.mark.parametrize(
    ("reference", "parsed"),
    [
        ("127.0.0.1:5000/gpubook/yolo:v8n", ("127.0.0.1:5000", "gpubook/yolo", "v8n")),
        ("registry.example.com/training/yolo:v8n-cu118", ("registry.example.com", "training/yolo", "v8n-cu118")),
        ("ultralytics/ultralytics:8.3", ("registry-1.docker.io", "ultralytics/ultralytics", "8.3")),
        ("python", ("registry-1.docker.io", "library/python", "latest")),
        ("localhost/yolo", ("localhost", "yolo", "latest")),
    ],
)
def test_parse_image(reference, parsed):
    image = parse_image(reference)
    assert (image.registry, image.repository, image.tag) == parsed


def test_a_digest_reference_cannot_be_pinned_again():
    with pytest.raises(RegistryError, match="already pinned"):
        parse_image("yolo@sha256:" + "a" * 64)


@pytest.mark.django_db
def test_the_catalog_admin_shows_tag_and_digest(client, django_user_model):
    admin = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(admin)
    TrainingImage.objects.all().delete()
    digest = "sha256:" + "cd" * 32
    image = TrainingImage.objects.create(name="yolo", tag="v8n-cu118", digest=digest)
    TrainingImage.objects.create(name="yolo", tag="v11s-cu121")
    page = client.get("/admin/training/trainingimage/").content.decode()
    assert "v8n-cu118" in page and digest in page and "not pinned" in page
    page = client.get(f"/admin/training/trainingimage/{image.pk}/change/").content.decode()
    assert f"yolo@{digest}" in page


@pytest.mark.django_db
def test_the_catalog_configmap_lists_exactly_what_runs_pull(settings):
    from training.execution import kubernetes_config_from_settings
    from training.models import TrainingImage

    settings.GPUBOOK_IMAGE_REGISTRY = "registry.example.com/training/"
    TrainingImage.objects.all().delete()
    TrainingImage.objects.create(name="yolo", tag="v8n-cu118", digest=PINNED)
    TrainingImage.objects.create(name="yolo", tag="unpinned")
    TrainingImage.objects.create(name="old", tag="v1", digest="sha256:" + "1" * 64, allowed=False)
    out = StringIO()
    call_command("images", "configmap", stdout=out)
    configmap = yaml.safe_load(out.getvalue())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kubernetes_validate.validate(configmap, "1.30", strict=True)
    assert configmap["metadata"] == {"name": "gpubook-image-catalog", "namespace": "gpubook",
                                     "labels": {"app.kubernetes.io/part-of": "gpubook"}}
    assert configmap["data"]["images"].split("\n") == [f"registry.example.com/training/yolo@{PINNED}"]
    assert configmap["data"]["images"].split("\n")[0] in kubernetes_config_from_settings().image_allowlist
