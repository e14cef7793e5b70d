"""Training pages: jobs with their progress, run detail with live curves and the log tail,
artifact downloads, and the team's model registry. Views parse, call one service or read,
and render; a request from htmx gets the live partial only."""

import json
from pathlib import Path

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Prefetch
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import trigger_client_event

import scheduler
from config.errors import DomainError, ErrorCode
from config.scheduling import policy_from_settings
from reservations.models import Reservation
from reservations.selectors import reservations_visible_to
from training import advice, selectors, services, tuning
from training.execution import executor_from_settings
from training.models import Artifact, Run, RunMetric, TrainingImage, TrainingJob
from training.queue import queue_estimate_preview
from training.run_state import run_handle
from training.runtime import duration_words

LOSS_KEYS = ("box_loss", "cls_loss", "dfl_loss", "val_box_loss", "val_cls_loss", "val_dfl_loss")
QUALITY_KEYS = ("mAP50", "mAP50-95", "precision", "recall")


def _latest_runs(jobs) -> dict[int, Run]:
    latest: dict[int, Run] = {}
    for run in Run.objects.filter(job__in=jobs).order_by("job_id", "-created_at", "-id"):
        latest.setdefault(run.job_id, run)
    return latest


def _progress(job: TrainingJob, run: Run | None) -> dict:
    total = job.epochs_total or 0
    done = job.epochs_done
    eta = (run.progress or {}).get("eta_s") if run and run.state in Run.LIVE else None
    return {"done": done, "total": total, "percent": round(100 * done / total) if total else 0,
            "eta_minutes": round(eta / 60) if isinstance(eta, int | float) else None,
            "unit": "iteration" if tuning.is_tune(job) else "epoch"}  # a tune's progress counts iterations


@login_required
@require_http_methods(["GET", "POST"])
def jobs_page(request: HttpRequest) -> HttpResponse:
    error = None
    batch_advice = None
    if request.method == "POST":
        reservation = request.POST.get("reservation") or None
        try:
            reservation_id = int(reservation) if reservation else None
            document = services.job_spec_from_text(text=request.POST.get("spec_yaml", ""))
            # Batch advice and warnings come before the submit (issue #17): a spec asking for
            # more than the image's table allows is shown the warning and submitted only when
            # the person confirms.
            batch_advice = advice.advice_for_document(document=document, reservation_id=reservation_id)
            checking = request.POST.get("action") == "check"
            warned = bool(batch_advice and batch_advice["warnings"]) and not request.POST.get("confirm")
            if not checking and not warned:
                job = services.job_submit(
                    user=request.user, document=document, reservation_id=reservation_id, now=timezone.now()
                )
        except (DomainError, ValueError) as problem:
            error = problem
        else:
            if not checking and not warned:
                messages.success(request, f"Job “{job.name}” submitted.")
                return redirect("job-detail", job_id=job.pk)
    from training import logs

    query = request.GET.get("q", "").strip()
    found_lines = logs.log_search(user=request.user, query=query) if query else []
    jobs = list(selectors.jobs_visible_to(user=request.user)[:200])
    latest = _latest_runs(jobs)
    rows = [{"job": job, "run": latest.get(job.pk), "progress": _progress(job, latest.get(job.pk))} for job in jobs]
    upcoming = reservations_visible_to(user=request.user).filter(
        status__in=Reservation.UPCOMING_OR_ACTIVE, end__gt=timezone.now()
    ).select_related("node")[:50]
    estimate = _start_estimate(request) if request.method == "POST" and not error else {}
    return render(request, "training/jobs.html", {**estimate,
        "nav": "jobs", "rows": rows, "error": error, "upcoming": upcoming,
        "spec_yaml": request.POST.get("spec_yaml", _tuned_spec_text(request) or EXAMPLE_SPEC),
        "batch_advice": batch_advice,
        "log_query": query, "log_lines": found_lines,
        "chosen_reservation": request.POST.get("reservation") or "",
        "image_tables": [(image.reference, advice.batch_table_rows(image))
                         for image in TrainingImage.objects.filter(allowed=True) if image.recommended_batch],
        "any_live": any(row["run"] and row["run"].state in Run.LIVE for row in rows),
    }, status=400 if error else 200)


def _tuned_spec_text(request: HttpRequest) -> str | None:
    """`?from_tune=<job>`: the form pre-filled with the spec a tune's best values make (issue #17)."""
    job_id = request.GET.get("from_tune")
    if request.method != "GET" or not job_id:
        return None
    job = _job_or_404(request, int(job_id) if job_id.isdigit() else 0)
    try:
        best, document = tuning.job_tuned_spec(job=job)
    except DomainError as problem:
        messages.error(request, problem.detail)
        return None
    return tuning.spec_text(document, best=best)


EXAMPLE_SPEC = """task_name: shapes-detector
image: yolo:v8n-cu118
team: vision
yolo:
  model: yolov8n.yaml
  data: /path/under/your/data/root/data.yaml
  epochs: 5
  imgsz: 64
  export: [onnx]
resources: {gpu: 1}
priority: medium
estimated_duration: 15m
"""


def _start_estimate(request: HttpRequest) -> dict:
    """The submit form's estimate for the spec as typed: when it would start and for how long it
    would run (training.queue.queue_estimate_preview: the scheduler's stored-estimate rule)."""
    now = timezone.now()
    reservation = request.POST.get("reservation") or None
    try:
        preview = queue_estimate_preview(
            user=request.user, document=services.job_spec_from_text(text=request.POST.get("spec_yaml", "")),
            reservation_id=int(reservation) if reservation else None, now=now, policy=policy_from_settings(),
        )
    except (DomainError, ValueError) as problem:
        return {"estimate_problem": getattr(problem, "detail", "Choose a booking from the list.")}
    job = preview.job
    moment = preview.estimated_start or preview.not_before
    wait_s = (moment - now).total_seconds() if moment else 0
    return {"estimate": preview, "runtime_words": duration_words(
        job.predicted_duration_s or scheduler.DEFAULT_POLICY.default_estimate_s
    ), "wait_words": duration_words(wait_s) if wait_s >= 60 else ""}


@login_required
@require_POST
def job_estimate(request: HttpRequest) -> HttpResponse:
    """The submit form's estimate, refreshed by htmx as the spec or the booking changes."""
    return render(request, "training/_start_estimate.html", _start_estimate(request))


@login_required
@require_GET
def queue_page(request: HttpRequest) -> HttpResponse:
    return render(request, "training/queue.html", {"nav": "queue", "rows": selectors.queue_for(user=request.user)})


def _job_or_404(request: HttpRequest, job_id: int) -> TrainingJob:
    return get_object_or_404(selectors.jobs_visible_to(user=request.user), pk=job_id)


@login_required
@require_GET
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _job_or_404(request, job_id)
    runs = list(job.runs.order_by("-created_at", "-id"))
    bookings = []
    if job.state == TrainingJob.State.QUEUED:  # where it may be attached: the team's live bookings
        bookings = list(
            reservations_visible_to(user=request.user)
            .filter(team=job.team, status__in=Reservation.UPCOMING_OR_ACTIVE, end__gt=timezone.now())
            .select_related("node", "user").order_by("start", "id")[:50]
        )
    tune = None
    if tuning.is_tune(job):
        points = tuning.tune_points(job=job)
        tune = {"done": len(points), "best": tuning.best_point(points)}
    return render(request, "training/job_detail.html", {
        "nav": "jobs", "job": job, "runs": runs, "progress": _progress(job, runs[0] if runs else None), "tune": tune,
        "spec_text": json.dumps(job.spec, indent=2), "bookings": bookings,
        "runtime_words": duration_words(job.predicted_duration_s or scheduler.DEFAULT_POLICY.default_estimate_s),
        "booking": job.reservation if job.reservation_id else None,
    })


@login_required
@require_POST
def job_attach(request: HttpRequest, job_id: int) -> HttpResponse:
    """Attach the job to a booking (it runs in that slot) or, with no booking, queue it."""
    job = _job_or_404(request, job_id)
    reservation = request.POST.get("reservation") or None
    try:
        services.job_attach(job_id=job.pk, reservation_id=int(reservation) if reservation else None,
                            actor=request.user, now=timezone.now())
    except (DomainError, ValueError) as problem:
        messages.error(request, getattr(problem, "detail", "Choose a booking from the list."))
    else:
        messages.success(request, f"Job attached to booking #{reservation}." if reservation
                         else "Job detached: it waits for idle GPUs (backfill).")
    return redirect("job-detail", job_id=job.pk)


@login_required
@require_http_methods(["GET", "POST"])
def booking_job(request: HttpRequest, reservation_id: int) -> HttpResponse:
    """A booking's job, in the calendar's booking panel: which job it will run, and attaching a
    waiting job of the team to it or detaching its job (the same service as the job page).
    Only bookings the viewer may see in full (their teams'), like the panel itself."""
    reservation = get_object_or_404(
        reservations_visible_to(user=request.user).select_related("team", "node"), pk=reservation_id
    )
    error = done = None
    if request.method == "POST":
        attach = request.POST.get("action") == "attach"
        try:
            job = _job_or_404(request, int(request.POST.get("job") or ""))
            if not attach and job.reservation_id != reservation.pk:
                raise DomainError(ErrorCode.NOT_WAITING, f"Job “{job.name}” is not attached to this booking.")
            services.job_attach(job_id=job.pk, reservation_id=reservation.pk if attach else None,
                                actor=request.user, now=timezone.now())
        except (DomainError, ValueError) as problem:
            error = getattr(problem, "detail", "Choose a job from the list.")
        else:
            done = (f"Job “{job.name}” will run in this booking." if attach
                    else f"Job “{job.name}” detached: it waits for idle GPUs (backfill).")
            if not request.htmx:
                messages.success(request, done)
                return redirect("booking-detail", reservation.pk)
    now = timezone.now()
    booked_job = selectors.booking_job(reservation_id=reservation.pk)
    live = reservation.status in Reservation.UPCOMING_OR_ACTIVE and reservation.end > now
    waiting = []
    if live:  # the team's waiting jobs that may move here (job_attach decides again on submit)
        waiting = list(
            selectors.jobs_visible_to(user=request.user)
            .filter(team=reservation.team, state=TrainingJob.State.QUEUED, gpus_needed__lte=reservation.gpu_count)
            .exclude(reservation=reservation).order_by("submitted_at", "pk")[:50]
        )
    context = {"reservation": reservation, "job": booked_job, "waiting": waiting, "live": live,
               "error": error, "done": done, "nav": "mine"}
    if not request.htmx:
        return render(request, "training/booking_job.html", context, status=400 if error else 200)
    response = render(request, "training/_booking_job.html", context)
    if done:  # the calendar redraws the booking, now titled with its job
        trigger_client_event(response, "reservations-changed", {"reservation": reservation.pk})
    return response


@login_required
@require_POST
def job_cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _job_or_404(request, job_id)
    try:
        services.job_cancel(job_id=job.pk, actor=request.user, now=timezone.now())
        messages.success(request, "Job cancelled; a running run checkpoints and stops.")
    except DomainError as problem:
        messages.error(request, problem.detail)
    return redirect("job-detail", job_id=job.pk)


def series(metrics: list[RunMetric]) -> dict:
    """Epoch curves for the charts: {"epochs": [...], "<metric>": [...]}, one point per epoch
    (a resumed run may report an epoch again: the last report wins)."""
    by_epoch: dict[int, dict] = {}
    for metric in metrics:
        if metric.event == "epoch" and metric.epoch is not None:
            by_epoch[metric.epoch] = metric.values
    epochs = sorted(by_epoch)
    return {"epochs": epochs, **{key: [by_epoch[e].get(key) for e in epochs] for key in (*LOSS_KEYS, *QUALITY_KEYS)}}


def _run_context(request: HttpRequest, run_id: int) -> dict:
    run = get_object_or_404(
        selectors.runs_visible_to(user=request.user).select_related("job__team", "node")
        .prefetch_related(Prefetch("artifacts", queryset=Artifact.objects.order_by("name"))), pk=run_id,
    )
    # The curves span the whole job: a resumed run continues its predecessor's epochs.
    metrics = list(RunMetric.objects.filter(run__job_id=run.job_id).order_by("run_id", "id"))
    handle = run_handle(run)
    try:
        log = executor_from_settings().log_tail(handle, lines=60) if handle is not None else ""
    except Exception:
        log = ""
    tune = None
    if tuning.is_tune(run.job):
        points = tuning.tune_points(job=run.job)
        tune = {"series": tuning.tune_series(points), "best": tuning.best_point(points)}
    return {"nav": "jobs", "run": run, "job": run.job, "live": run.state in Run.LIVE, "log": log,
            "series": series(metrics), "progress": _progress(run.job, run), "tune": tune}


@login_required
@require_GET
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    context = _run_context(request, run_id)
    template = "training/_run_live.html" if request.htmx else "training/run_detail.html"
    return render(request, template, context)


@login_required
@require_GET
def artifact_download(request: HttpRequest, run_id: int, name: str) -> FileResponse:
    run = get_object_or_404(selectors.runs_visible_to(user=request.user), pk=run_id)
    artifact = get_object_or_404(Artifact, run=run, name=name)
    base = Path(run.output_dir).resolve()
    path = (base / artifact.path).resolve()
    if not path.is_relative_to(base) or not path.is_file():  # never serve outside the run's folder
        raise Http404("The file is not there any more.")
    return FileResponse(path.open("rb"), as_attachment=True, filename=Path(artifact.name).name)


@login_required
@require_GET
def models_page(request: HttpRequest) -> HttpResponse:
    """The team's model registry: best weights of finished jobs with their final metrics."""
    runs = list(
        selectors.runs_visible_to(user=request.user)
        .filter(job__state=TrainingJob.State.SUCCEEDED, state=Run.State.SUCCEEDED, artifacts__name="best.pt")
        .select_related("job__team", "job__user").prefetch_related("artifacts").order_by("-ended_at")[:200]
    )
    finals = {}
    for metric in RunMetric.objects.filter(run__in=runs, event__in=("final", "epoch")).order_by("run_id", "id"):
        finals[metric.run_id] = metric.values  # the last one: "final" comes after the epochs
    rows = [{"run": run, "values": [finals.get(run.pk, {}).get(key) for key in QUALITY_KEYS],
             "weights": next((a for a in run.artifacts.all() if a.name == "best.pt"), None),
             "onnx": next((a for a in run.artifacts.all() if a.name.endswith(".onnx")), None)} for run in runs]
    from training import registry

    registered = []
    for model in registry.models_visible_to(user=request.user):
        latest = model.versions.order_by("-version").first()
        registered.append({"model": model, "latest": latest, "map": latest.metrics.get("mAP50-95") if latest else None})
    return render(request, "training/models.html", {"nav": "models", "rows": rows, "columns": QUALITY_KEYS,
                                                     "registered": registered})


@login_required
@require_GET
def run_log(request: HttpRequest, run_id: int) -> HttpResponse:
    """A run's kept log, every line numbered and linkable (#L12); the live tail while it runs."""
    from training.models import RunLogLine

    run = get_object_or_404(selectors.runs_visible_to(user=request.user).select_related("job"), pk=run_id)
    lines = list(RunLogLine.objects.filter(run=run).order_by("number").values_list("number", "text")[:20000])
    return render(request, "training/run_log.html", {
        "nav": "jobs", "run": run, "lines": lines, "kept": hasattr(run, "full_log"),
        "archived": run.archives.filter(kind="run_log", restored_at__isnull=True).first(),
    })
