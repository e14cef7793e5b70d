from django.urls import path

from training import registry_views, views

urlpatterns = [
    path("jobs/", views.jobs_page, name="jobs"),
    path("queue/", views.queue_page, name="queue"),
    path("jobs/estimate/", views.job_estimate, name="job-estimate"),
    path("jobs/<int:job_id>/", views.job_detail, name="job-detail"),
    path("jobs/<int:job_id>/cancel/", views.job_cancel, name="job-cancel"),
    path("jobs/<int:job_id>/attach/", views.job_attach, name="job-attach"),
    # the booking panel's job section (the calendar): which job a booking runs; attach, detach
    path("reservations/<int:reservation_id>/job/", views.booking_job, name="booking-job"),
    path("runs/<int:run_id>/", views.run_detail, name="run-detail"),
    path("runs/<int:run_id>/log/", views.run_log, name="run-full-log"),
    path("runs/<int:run_id>/artifacts/<path:name>", views.artifact_download, name="run-artifact"),
    path("models/", views.models_page, name="models"),
    # the model registry (issue #17)
    path("models/promote/", registry_views.promote, name="model-promote"),
    path("models/<slug:team>/<slug:name>/", registry_views.model_detail, name="model-detail"),
    path("models/<slug:team>/<slug:name>/v<int:version>/<str:filename>", registry_views.version_download,
         name="model-version-file"),
]
