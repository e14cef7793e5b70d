from django.urls import path
from rest_framework.routers import SimpleRouter

from reservations import api

router = SimpleRouter()
router.register("gpus", api.GpuViewSet, basename="gpu")
router.register("reservations", api.ReservationViewSet, basename="reservation")
router.register("teams", api.TeamViewSet, basename="team")

urlpatterns = [
    path("nodes/<int:pk>/availability/", api.NodeAvailabilityView.as_view(), name="node-availability"),
    *router.urls,
]
