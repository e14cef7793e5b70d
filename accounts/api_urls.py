"""Include under /api/v1/auth/."""

from django.urls import path, re_path

from accounts import api

urlpatterns = [
    path("token/", api.TokenView.as_view(), name="api-token"),
    path("tokens/", api.TokenListView.as_view(), name="api-tokens"),
    re_path(r"^tokens/(?P<pk>[0-9]{1,18})/$", api.TokenDetailView.as_view(), name="api-token-detail"),
]
