from django.urls import path

from gpus import api

urlpatterns = [
    path("telemetry/samples/", api.TelemetrySamplesView.as_view(), name="telemetry-samples"),
]
