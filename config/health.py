"""`/healthz`: what a load balancer, compose or a kubelet probe asks. 200 "ok" when the
database answers, 503 otherwise; no login, no session, nothing written."""

from django.db import connection
from django.db.utils import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache


@never_cache
def healthz(request: HttpRequest) -> HttpResponse:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError:
        return HttpResponse("database unreachable\n", status=503, content_type="text/plain")
    return HttpResponse("ok\n", content_type="text/plain")
