from django.apps import AppConfig


class ReportsConfig(AppConfig):
    """Utilization reports: booked vs used GPU time, booked-but-idle bookings, quota burn."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "reports"
