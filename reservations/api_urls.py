from django.urls import path
from rest_framework.routers import SimpleRouter

from reservations import api, recurring, waitlist

router = SimpleRouter()
router.register("gpus", api.GpuViewSet, basename="gpu")
router.register("reservations", api.ReservationViewSet, basename="reservation")
router.register("teams", api.TeamViewSet, basename="team")
router.register("series", recurring.SeriesViewSet, basename="series")  # recurring bookings
router.register("waitlist", waitlist.WaitlistViewSet, basename="waitlist")

urlpatterns = [
    path("nodes/<int:pk>/availability/", api.NodeAvailabilityView.as_view(), name="node-availability"),
    path("booking-placement/", api.BookingPlacementView.as_view(), name="booking-placement"),
    *router.urls,
]
