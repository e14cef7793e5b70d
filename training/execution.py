"""The executor this deployment uses, built from settings (executors themselves know no Django)."""

import functools
import os
from pathlib import Path

from django.conf import settings

from training.executors.base import Executor


def kubernetes_config_from_settings():
    from training.executors.kubernetes import KubernetesConfig
    from training.models import TrainingImage

    registry = settings.GPUBOOK_IMAGE_REGISTRY
    data_root, data_subpaths = data_volume_layout(settings.GPUBOOK_DATA_ROOTS)
    return KubernetesConfig(
        image_allowlist=tuple(
            registry + image.pinned_reference for image in TrainingImage.objects.filter(allowed=True)
        ),
        namespace_template=settings.GPUBOOK_K8S_NAMESPACE_TEMPLATE,
        data_pvc=settings.GPUBOOK_K8S_DATA_PVC,
        data_mount_path=data_root,
        data_subpaths=data_subpaths,
        runs_pvc=settings.GPUBOOK_K8S_RUNS_PVC,
        runs_mount_path=str(settings.GPUBOOK_RUNS_DIR),  # the same path in the scheduler and the pods
        default_memory=settings.GPUBOOK_K8S_DEFAULT_MEMORY or None,
        tmp_size_limit=settings.GPUBOOK_K8S_TMP_SIZE_LIMIT,
        image_pull_secrets=parse_pull_secrets(settings.GPUBOOK_K8S_IMAGE_PULL_SECRETS),
        stuck_patience_s=float(settings.GPUBOOK_K8S_STUCK_PATIENCE_SECONDS),
    )


def data_volume_layout(roots: list[str]) -> tuple[str, tuple[str, ...]]:
    """The data volume's root (the roots' common parent, mounted at the same path in the pods)
    and the parts a team's pods mount: ["/d/{team}", "/d/shared"] → ("/d", ("{team}", "shared"))."""
    if not roots:
        return "/data", ()
    base = os.path.commonpath([os.path.dirname(root.rstrip("/")) for root in roots])
    return base, tuple(os.path.relpath(root, base) for root in roots)


def parse_pull_secrets(text: str) -> dict[str, tuple[str, ...]]:
    """"*=regcred;vision=a,b" → {"*": ("regcred",), "vision": ("a", "b")}."""
    secrets: dict[str, tuple[str, ...]] = {}
    for entry in filter(None, (part.strip() for part in text.split(";"))):
        team, sep, names = entry.partition("=")
        if not sep or not team.strip():
            raise ValueError(f"GPUBOOK_K8S_IMAGE_PULL_SECRETS: {entry!r} is not team=secret[,secret]")
        secrets[team.strip()] = tuple(name.strip() for name in names.split(",") if name.strip())
    return secrets


@functools.cache
def executor_from_settings() -> Executor:
    """One executor per process: the local one keeps its children to reap them. (The image
    allowlist is read once; restart the scheduler after adding an image.)"""
    if settings.GPUBOOK_EXECUTOR == "kubernetes":
        from training.executors.kubernetes import KubernetesExecutor

        return KubernetesExecutor(kubernetes_config_from_settings())
    from training.executors.local import LocalConfig, LocalExecutor

    job_user = settings.GPUBOOK_JOB_USER
    if job_user:
        _close_server_files()
    return LocalExecutor(LocalConfig(
        state_dir=Path(settings.VAR_DIR) / "executor", job_user=job_user,
        refuse_commands=not job_user and not settings.GPUBOOK_SINGLE_USER,
    ))


def _close_server_files() -> None:
    """Jobs run as GPUBOOK_JOB_USER: the SQLite database (and its journal files) must not be
    readable by them. Directories stay traversable so the job reaches its runs folder."""
    database = settings.DATABASES["default"]
    if database["ENGINE"].endswith("sqlite3"):
        for suffix in ("", "-wal", "-shm", "-journal"):
            path = Path(str(database["NAME"]) + suffix)
            if path.exists():
                path.chmod(0o600)
