from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerSplitView

from accounts.sso_views import SsoCallbackView, SsoStartView
from config import openapi  # noqa: F401  (registers the schema extensions before any schema is built)
from config.api_errors import api_not_found
from config.health import favicon, healthz
from config.login_guard import GuardedAdminAuthenticationForm, GuardedLoginView
from gpus.metrics import metrics_view

admin.site.login_form = GuardedAdminAuthenticationForm

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/login/", GuardedLoginView.as_view(), name="login"),  # before auth.urls' own
    path("accounts/oidc/authenticate/", SsoStartView.as_view(), name="oidc_authentication_init"),
    path("accounts/oidc/callback/", SsoCallbackView.as_view(), name="oidc_authentication_callback"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("reservations.urls")),
    path("", include("training.urls")),
    path("api/v1/auth/", include("accounts.api_urls")),
    path("api/v1/", include("reservations.api_urls")),
    path("api/v1/", include("training.api_urls")),
    path("api/v1/", include("gpus.api_urls")),
    path("api/v1/notifications/", include("notifications.api_urls")),
    path("metrics", metrics_view, name="metrics"),
    path("healthz", healthz, name="healthz"),
    path("favicon.ico", favicon),
    path("reports/", include("reports.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="api-schema", template_name="api_docs/redoc.html"),
         name="api-redoc"),
    re_path(r"^api/", api_not_found),
]
