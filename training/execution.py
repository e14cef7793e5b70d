"""The executor this deployment uses, built from settings (executors themselves know no Django)."""

import functools
from pathlib import Path

from django.conf import settings

from training.executors.base import Executor


@functools.cache
def executor_from_settings() -> Executor:
    """One executor per process: the local one keeps its children to reap them."""
    if settings.GPUBOOK_EXECUTOR == "kubernetes":
        from training.executors.kubernetes import KubernetesConfig, KubernetesExecutor
        from training.models import TrainingImage

        registry = settings.GPUBOOK_IMAGE_REGISTRY
        allowlist = tuple(registry + image.reference for image in TrainingImage.objects.filter(allowed=True))
        return KubernetesExecutor(
            KubernetesConfig(
                image_allowlist=allowlist, namespace_template=settings.GPUBOOK_K8S_NAMESPACE_TEMPLATE,
                data_pvc=settings.GPUBOOK_K8S_DATA_PVC, runs_pvc=settings.GPUBOOK_K8S_RUNS_PVC,
            )
        )
    from training.executors.local import LocalConfig, LocalExecutor

    return LocalExecutor(LocalConfig(state_dir=Path(settings.VAR_DIR) / "executor"))
