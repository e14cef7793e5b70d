from django.urls import path

from reports import views

urlpatterns = [
    path("", views.index, name="reports"),
    path("utilization/", views.utilization, name="reports-utilization"),
    path("utilization.csv", views.utilization, {"as_csv": True}, name="reports-utilization-csv"),
    path("idle/", views.idle, name="reports-idle"),
    path("idle.csv", views.idle, {"as_csv": True}, name="reports-idle-csv"),
    path("quota/", views.quota, name="reports-quota"),
    path("quota.csv", views.quota, {"as_csv": True}, name="reports-quota-csv"),
]
