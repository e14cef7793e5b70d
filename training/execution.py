"""The executor this deployment uses, built from settings (executors themselves know no Django)."""

import functools
from pathlib import Path

from django.conf import settings

from training.executors.base import Executor


def kubernetes_config_from_settings():
    from training.executors.kubernetes import KubernetesConfig
    from training.models import TrainingImage

    registry = settings.GPUBOOK_IMAGE_REGISTRY
    return KubernetesConfig(
        image_allowlist=tuple(registry + image.reference for image in TrainingImage.objects.filter(allowed=True)),
        namespace_template=settings.GPUBOOK_K8S_NAMESPACE_TEMPLATE,
        data_pvc=settings.GPUBOOK_K8S_DATA_PVC,
        runs_pvc=settings.GPUBOOK_K8S_RUNS_PVC,
        runs_mount_path=str(settings.GPUBOOK_RUNS_DIR),  # the same path in the scheduler and the pods
    )


@functools.cache
def executor_from_settings() -> Executor:
    """One executor per process: the local one keeps its children to reap them. (The image
    allowlist is read once; restart the scheduler after adding an image.)"""
    if settings.GPUBOOK_EXECUTOR == "kubernetes":
        from training.executors.kubernetes import KubernetesExecutor

        return KubernetesExecutor(kubernetes_config_from_settings())
    from training.executors.local import LocalConfig, LocalExecutor

    return LocalExecutor(LocalConfig(state_dir=Path(settings.VAR_DIR) / "executor"))
