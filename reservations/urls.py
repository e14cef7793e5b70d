"""Pages (server-rendered, htmx). The REST API lives in api_urls.py."""

from django.urls import path
from django.views.generic import RedirectView

from reservations import approvals, views

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="calendar", permanent=False), name="home"),
    path("calendar/", views.calendar_page, name="calendar"),
    path("calendar/events.json", views.calendar_events, name="calendar-events"),
    path("calendar/quotas/", views.quota_bars_partial, name="quota-bars"),
    path("book/", views.booking_new, name="booking-new"),
    path("reservations/", views.my_reservations, name="my-reservations"),
    path("reservations/<int:reservation_id>/", views.reservation_detail, name="booking-detail"),
    path("reservations/<int:reservation_id>/cancel/", views.reservation_cancel, name="booking-cancel"),
    path("reservations/<int:reservation_id>/release/", views.reservation_release, name="booking-release"),
    path(
        "reservations/<int:reservation_id>/reschedule/", views.reservation_reschedule, name="booking-reschedule"
    ),
    path("profile/", views.profile, name="profile"),
    path("profile/calendar-token/", views.profile_calendar_token, name="profile-calendar-token"),
    path("ical/<str:token>.ics", views.ical_feed, name="ical-feed"),
    # Managers' approvals (reservations/approvals.py)
    path("approvals/", approvals.approvals_page, name="approvals"),
    path("approvals/<int:reservation_id>/approve/", approvals.approve, name="approval-approve"),
    path("approvals/<int:reservation_id>/reject/", approvals.reject, name="approval-reject"),
]
