from django.urls import path
from rest_framework.routers import SimpleRouter

from training import api, registry_api

router = SimpleRouter()
# Named api-*: the pages own "job-detail" and "run-detail" ({% url %} in templates).
router.register("jobs", api.JobViewSet, basename="api-job")
router.register("runs", api.RunViewSet, basename="api-run")

urlpatterns = [
    path("runs/<int:pk>/report/", api.RunReportView.as_view(), name="run-report"),
    # the model registry (issue #17)
    path("models/", registry_api.ModelListView.as_view(), name="api-models"),
    path("models/promote/", registry_api.PromoteView.as_view(), name="api-model-promote"),
    path("models/<int:pk>/", registry_api.ModelVersionsView.as_view(), name="api-model-versions"),
    path("models/<int:pk>/compare/", registry_api.CompareView.as_view(), name="api-model-compare"),
    path("models/<int:pk>/file/", registry_api.VersionFileView.as_view(), name="api-model-version-file"),
    *router.urls,
]
