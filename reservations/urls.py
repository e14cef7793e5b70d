"""Pages (server-rendered, htmx). The REST API lives in api_urls.py."""

urlpatterns: list = []
