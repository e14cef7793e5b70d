"""Model registry pages: promote a run, a model's versions, two versions side by side, downloads."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from config.errors import DomainError, NotFound
from training import registry


@login_required
@require_POST
def promote(request: HttpRequest) -> HttpResponse:
    try:
        version = registry.model_promote(
            run_id=int(request.POST.get("run", "0")), name=request.POST.get("name", "").strip(),
            note=request.POST.get("note", ""), actor=request.user, now=timezone.now(),
        )
    except (DomainError, ValueError) as problem:
        messages.error(request, getattr(problem, "detail", "Give a run and a model name."))
        return redirect("models")
    messages.success(request, f"Run #{version.run_id} is now {version}.")
    return redirect("model-detail", team=version.model.team.slug, name=version.model.name)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


@login_required
@require_GET
def model_detail(request: HttpRequest, team: str, name: str) -> HttpResponse:
    try:
        model = registry.model_get(user=request.user, team_slug=team, name=name)
    except NotFound as missing:
        raise Http404(missing.detail) from missing
    versions = list(model.versions.select_related("run", "promoted_by"))
    compare = None
    a, b = _int(request.GET.get("a")), _int(request.GET.get("b"))
    if a is not None and b is not None:
        try:
            left, right = registry.version_get(model=model, version=a), registry.version_get(model=model, version=b)
            compare = {"a": left, "b": right, "rows": registry.version_compare(a=left, b=right)}
        except NotFound as missing:
            messages.error(request, missing.detail)
    files = {version.version: registry.version_files(version=version) for version in versions}
    rows = [{"version": version, "files": files[version.version],
             "headline": [version.metrics.get(key) for key in registry.HEADLINE_METRICS[:4]]} for version in versions]
    return render(request, "training/model_detail.html", {
        "nav": "models", "model": model, "rows": rows, "compare": compare,
        "headline": registry.HEADLINE_METRICS[:4], "a": a, "b": b,
    })


@login_required
@require_GET
def version_download(request: HttpRequest, team: str, name: str, version: int, filename: str) -> FileResponse:
    try:
        model = registry.model_get(user=request.user, team_slug=team, name=name)
        path = registry.version_file_path(version=registry.version_get(model=model, version=version), name=filename)
    except NotFound as missing:
        raise Http404(missing.detail) from missing
    return FileResponse(path.open("rb"), as_attachment=True, filename=f"{name}-v{version}-{filename}")
