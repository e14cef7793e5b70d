"""One error shape for the whole API: {"code": ..., "detail": ...} (DESIGN.md "Errors")."""

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from config.errors import DomainError

_CODES_BY_CLASS = {
    exceptions.NotAuthenticated: "not_authenticated",
    exceptions.AuthenticationFailed: "authentication_failed",
    exceptions.PermissionDenied: "permission_denied",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.Throttled: "rate_limited",
    exceptions.ParseError: "malformed_request",
}


def _flatten(detail: object, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(detail, dict):
        out: list[tuple[str, str]] = []
        for key, value in detail.items():
            out += _flatten(value, f"{prefix}.{key}" if prefix else str(key))
        return out
    if isinstance(detail, list):
        out = []
        for index, value in enumerate(detail):
            child_prefix = prefix if not isinstance(value, (dict, list)) else f"{prefix}[{index}]"
            out += _flatten(value, child_prefix)
        return out
    return [(prefix, str(detail))]


def exception_handler(exc, context):
    if isinstance(exc, DomainError):
        return Response(
            {"code": exc.code, "detail": exc.detail, **exc.extra}, status=exc.http_status
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None  # a real bug: let Django report it
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        sentence = "; ".join(f"{field}: {message}" if field else message for field, message in fields)
        body = {"code": "invalid", "detail": sentence or "Invalid input.", "fields": exc.detail}
    else:
        code = next(
            (value for klass, value in _CODES_BY_CLASS.items() if isinstance(exc, klass)), "error"
        )
        body = {"code": code, "detail": str(exc.detail)}
        if isinstance(exc, exceptions.Throttled) and exc.wait:
            body["retry_after_s"] = int(exc.wait)
    response.data = body
    return response


@csrf_exempt  # like every API view: an unknown path is a 404 whatever the method and cookies
def api_not_found(request, *args, **kwargs):
    """Unknown /api/ paths answer in the API's error shape instead of an HTML page."""
    from django.http import JsonResponse

    return JsonResponse({"code": "not_found", "detail": "Not found."}, status=status.HTTP_404_NOT_FOUND)
