from django.urls import path

from training import views

urlpatterns = [
    path("jobs/", views.jobs_page, name="jobs"),
    path("jobs/<int:job_id>/", views.job_detail, name="job-detail"),
    path("jobs/<int:job_id>/cancel/", views.job_cancel, name="job-cancel"),
    path("runs/<int:run_id>/", views.run_detail, name="run-detail"),
    path("runs/<int:run_id>/artifacts/<path:name>", views.artifact_download, name="run-artifact"),
    path("models/", views.models_page, name="models"),
]
