"""One error shape for the whole API: {"code": ..., "detail": ...} (DESIGN.md "Errors")."""

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from config.errors import DomainError, ErrorCode

_CODES_BY_CLASS = {
    exceptions.NotAuthenticated: ErrorCode.NOT_AUTHENTICATED,
    exceptions.AuthenticationFailed: ErrorCode.AUTHENTICATION_FAILED,
    exceptions.PermissionDenied: ErrorCode.PERMISSION_DENIED,
    exceptions.NotFound: ErrorCode.NOT_FOUND,
    exceptions.MethodNotAllowed: ErrorCode.METHOD_NOT_ALLOWED,
    exceptions.NotAcceptable: ErrorCode.NOT_ACCEPTABLE,
    exceptions.UnsupportedMediaType: ErrorCode.UNSUPPORTED_MEDIA_TYPE,
    exceptions.Throttled: ErrorCode.RATE_LIMITED,
    exceptions.ParseError: ErrorCode.MALFORMED_REQUEST,
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
        body = {"code": ErrorCode.INVALID, "detail": sentence or "Invalid input.", "fields": exc.detail}
    else:
        code = next(
            (value for klass, value in _CODES_BY_CLASS.items() if isinstance(exc, klass)), ErrorCode.ERROR
        )
        body = {"code": code, "detail": str(exc.detail)}
        if isinstance(exc, exceptions.Throttled) and exc.wait:
            body["retry_after_s"] = int(exc.wait)
    response.data = body
    return response


@csrf_exempt  # a POST to an unknown /api/ path is a 404 in the API's shape, not Django's CSRF page
def api_not_found(request, *args, **kwargs):
    """Unknown /api/ paths answer in the API's error shape instead of an HTML page."""
    from django.http import JsonResponse

    return JsonResponse({"code": ErrorCode.NOT_FOUND, "detail": "Not found."}, status=status.HTTP_404_NOT_FOUND)
