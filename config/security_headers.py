"""Content-Security-Policy on every response (docs/security.md).

Scripts come only from this origin (the vendored files under static/): no inline script, no
eval, no third-party host. A value a user stored that reaches a page unescaped still cannot
run. Data for scripts travels in `json_script` blocks (type="application/json", never
executed). Inline *styles* stay allowed: Plotly and the calendar set them at run time, and a
style cannot run code.
"""

from django.conf import settings


def content_security_policy() -> str:
    directives = {
        "default-src": "'self'",
        "script-src": "'self'",
        "style-src": "'self' 'unsafe-inline'",
        "img-src": "'self' data: blob:",
        "font-src": "'self' data:",
        "connect-src": "'self'",
        "worker-src": "'self' blob:",
        "object-src": "'none'",
        "base-uri": "'none'",
        "form-action": "'self'",
        "frame-ancestors": "'none'",
    }
    if settings.GPUBOOK_CSP_REPORT_URI:
        directives["report-uri"] = settings.GPUBOOK_CSP_REPORT_URI
    return "; ".join(f"{name} {value}" for name, value in directives.items())


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response
        self.header = content_security_policy()

    def __call__(self, request):
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", self.header)
        response.headers.setdefault("Referrer-Policy", "same-origin")
        return response


# --- secrets in URLs kept out of logs -------------------------------------------------------------
import logging  # noqa: E402
import re  # noqa: E402

# A calendar feed is fetched by calendar apps that can only send a URL, so its token is in the
# path; access logs (runserver's django.server, gunicorn.access, django.request) must not keep it.
_ICAL_TOKEN = re.compile(r"(/ical/)[^/\s\"'?]+?(\.ics)")


def redact(text: str) -> str:
    return _ICAL_TOKEN.sub(r"\1[token]\2", text)


class RedactSecretsFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True
