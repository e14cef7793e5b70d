from django.urls import path
from rest_framework.routers import SimpleRouter

from training import api

router = SimpleRouter()
router.register("jobs", api.JobViewSet, basename="job")
router.register("runs", api.RunViewSet, basename="run")

urlpatterns = [
    path("runs/<int:pk>/report/", api.RunReportView.as_view(), name="run-report"),
    *router.urls,
]
