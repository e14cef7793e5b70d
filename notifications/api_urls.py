"""Include under /api/v1/notifications/."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from notifications import api

router = SimpleRouter()
router.register("webhooks", api.WebhookViewSet, basename="notification-webhook")

urlpatterns = [
    path("preferences/", api.PreferenceView.as_view(), name="notification-preferences"),
    *router.urls,
]
