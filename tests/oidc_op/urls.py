from django.contrib.auth.views import LoginView
from django.urls import include, path

urlpatterns = [
    path("login/", LoginView.as_view(template_name="op_login.html"), name="login"),
    path("", include("oidc_provider.urls", namespace="oidc_provider")),
]
