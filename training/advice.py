"""What a YOLO job will train with on given GPUs, and what the submit form says about it.

One place reads the image's defaults and batch table (jobspec.resolve_yolo) for three callers:
the submit form and API (advice and warnings before submit), job_submit (the TensorRT check),
and the run's start (the runner's spec gets the batch for the GPUs it actually got).
"""

import re
from collections.abc import Mapping
from typing import Any

from django.conf import settings

from gpus.models import Gpu
from reservations.models import Reservation, Team
from training import seed_style
from training.jobspec import JobSpecError, ResolvedYolo, parse_job_spec, resolve_yolo
from training.models import Run, TrainingImage
from training.services import data_roots_for, largest_node_gpu_count

# pynvml names start with "NVIDIA"; a declared inventory may say "A100-80GB" or "RTX 4090".
_NVIDIA = re.compile(r"nvidia|tesla|geforce|quadro|titan|\brtx\b|\b[abhltv]\d{1,3}[a-z]?\b", re.IGNORECASE)


def is_nvidia(model_name: str) -> bool:
    return bool(_NVIDIA.search(model_name or ""))


def engine_refusal(*, reservation: Reservation | None) -> str | None:
    """Why a TensorRT (engine) export cannot be made for a job, or None if it can."""
    if settings.GPUBOOK_RUNNER_DEVICE != "cuda":
        return ("export `engine` (TensorRT) needs CUDA, and this deployment trains on the CPU "
                "(GPUBOOK_RUNNER_DEVICE=cpu); use onnx, torchscript or openvino")
    if reservation is not None:
        names = list(reservation.gpus.values_list("model_name", flat=True))
        if not any(is_nvidia(name) for name in names):
            return (f"export `engine` (TensorRT) needs an NVIDIA GPU, and node {reservation.node.name} of "
                    f"booking #{reservation.pk} has none ({', '.join(sorted(set(names))) or 'no GPUs'})")
        return None
    names = Gpu.objects.filter(state=Gpu.State.ACTIVE).values_list("model_name", flat=True)
    if not any(is_nvidia(name) for name in names):
        return "export `engine` (TensorRT) needs an NVIDIA GPU, and no node here has one"
    return None


def _smallest_memory(gpus) -> int | None:
    memories = [gpu.memory_mib for gpu in gpus if gpu.memory_mib]
    return min(memories) if memories else None


def yolo_advice(
    *, yolo: Mapping[str, Any], image: TrainingImage, reservation: Reservation | None, gpus: int
) -> tuple[ResolvedYolo, str]:
    """(what the job would train with, on which GPUs that was worked out), before submit.

    A booked job is advised for its booking's GPUs; a queued one for the smallest active GPU
    it could land on (its run's start works it out again for the GPUs it gets)."""
    if reservation is not None:
        memory = _smallest_memory(reservation.gpus.all())
        basis = f"booking #{reservation.pk} on {reservation.node.name}"
    else:
        memory = _smallest_memory(Gpu.objects.filter(state=Gpu.State.ACTIVE))
        basis = "the smallest GPU a queued job may get"
    resolved = resolve_yolo(
        yolo, image_defaults=image.default_hyperparameters, batch_table=image.recommended_batch,
        gpu_memory_mib=memory, gpus=gpus,
    )
    return resolved, basis


def yolo_for_run(run: Run) -> ResolvedYolo:
    """What this run trains with: the job's spec (as parsed at submit) over its image's
    defaults, the batch from the table for the GPUs this run holds."""
    job = run.job
    gpus = list(Gpu.objects.filter(pk__in=run.gpu_ids))
    return resolve_yolo(
        job.parsed_spec["yolo"], image_defaults=job.image.default_hyperparameters,
        batch_table=job.image.recommended_batch, gpu_memory_mib=_smallest_memory(gpus),
        gpus=max(len(run.gpu_indices), 1),
    )


def batch_table_rows(image: TrainingImage) -> list[str]:
    """The image's table in words, smallest GPU first: ["batch 64 for a 16 GB GPU", ...]."""
    from training.jobspec import gpu_size_words

    rows = []
    for limit, batch in sorted(image.recommended_batch.items(), key=lambda item: int(item[0])):
        rows.append(f"batch {batch} for a {gpu_size_words(int(limit))} GPU")
    return rows


def advice_for_document(*, document: Any, reservation_id: int | None) -> dict | None:
    """Advice and warnings for a pasted spec before it is submitted, or None when there is
    nothing to advise (not a YOLO job, an unknown image; job_submit reports those). A seed-style
    file is read as job_submit reads it."""
    document = seed_style.normalize_submitted(document)
    if not isinstance(document, Mapping) or not isinstance(document.get("yolo"), Mapping):
        return None
    image_ref = document.get("image")
    image = next((i for i in TrainingImage.objects.filter(allowed=True) if i.reference == image_ref), None)
    if image is None:
        return None
    team_slug = document.get("team")
    team = Team.objects.filter(slug=team_slug).first() if isinstance(team_slug, str) else None
    try:  # resolve_yolo trusts what it is given: only a spec job_submit would take is advised on
        parse_job_spec(document, allowed_images={image.reference}, max_gpus=largest_node_gpu_count(),
                       data_roots=data_roots_for(team) if team else [])
    except JobSpecError:
        return None  # the spec check names it
    yolo = document["yolo"]
    reservation = None
    if reservation_id is not None:
        reservation = (
            Reservation.objects.select_related("node")
            .filter(pk=reservation_id, team__slug=document.get("team")).first()
        )
    resources = document.get("resources") if isinstance(document.get("resources"), Mapping) else {}
    gpus = resources.get("gpu", 1) if isinstance(resources.get("gpu", 1), int) else 1
    resolved, basis = yolo_advice(yolo=yolo, image=image, reservation=reservation, gpus=max(gpus, 1))
    return {
        "image": image.reference, "basis": basis, "advice": resolved.advice, "batch": resolved.batch,
        "batch_source": resolved.batch_source, "epochs": resolved.epochs, "imgsz": resolved.imgsz,
        "save_period": resolved.extra.get("save_period"),
        "export": [] if document.get("tune") else list(resolved.export),  # a tune exports nothing
        "warnings": list(resolved.warnings),
    }
