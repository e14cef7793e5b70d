"""Input refused before any view sees it (DESIGN.md "Errors": nothing a user sends yields a 500).

A NUL character cannot be stored in a PostgreSQL text column, and a query filtering on one
fails inside the database driver; rather than guard every filter, a request carrying one in
its path, query string or form body is answered 400 here, in the API's error shape. (JSON
bodies are checked by config.parsers.BoundedJSONParser, which also caps their depth.)
"""

from django.http import HttpResponse, JsonResponse
from rest_framework.pagination import LimitOffsetPagination

FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def _has_nul(query_dict) -> bool:
    return any("\x00" in key or any("\x00" in value for value in values) for key, values in query_dict.lists())


def refusal(request, detail: str) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse({"code": "malformed_request", "detail": detail}, status=400)
    return HttpResponse(detail, status=400, content_type="text/plain; charset=utf-8")


class RejectNulMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if "\x00" in request.path or _has_nul(request.GET):
            return refusal(request, "The address may not contain NUL characters.")
        if request.method == "POST" and request.content_type in FORM_TYPES and _has_nul(request.POST):
            return refusal(request, "Form fields may not contain NUL characters.")
        if "\x00" in request.headers.get("Authorization", ""):
            return refusal(request, "The Authorization header may not contain NUL characters.")
        return self.get_response(request)


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """LimitOffsetPagination with a `max_limit` and an offset the database can take (past
    2**63 PostgreSQL's OFFSET overflows). A negative or non-numeric offset means 0 (DRF's own
    reading); one past MAX_OFFSET reads as MAX_OFFSET, an empty page."""

    max_limit = 1000
    MAX_OFFSET = 10**9

    def get_offset(self, request):
        return min(super().get_offset(request), self.MAX_OFFSET)
