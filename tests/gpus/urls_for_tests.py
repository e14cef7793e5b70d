"""The project's URLs plus this room's (until the lead wires them into config/urls.py)."""

from django.urls import include, path

from config import urls as project_urls
from gpus.metrics import metrics_view

urlpatterns = [
    path("metrics", metrics_view, name="metrics"),
    path("api/v1/", include("gpus.api_urls")),
    path("reports/", include("reports.urls")),
    *project_urls.urlpatterns,
]
