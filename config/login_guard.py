"""Slows password guessing on every door that takes a password: the HTML login, the admin
login and the API token endpoint (docs/security.md).

Failures are counted per client address and per username in the shared cache (Redis in
production, so every web worker sees the same counts; process memory would give each worker
its own budget). Past the limit a door answers "too many attempts" until the window ends —
even to the right password, so guessing from many addresses at one account gains nothing.

The client address is REMOTE_ADDR unless GPUBOOK_NUM_PROXIES says how many trusted proxies
stand in front: then it is the address the outermost trusted proxy saw, taken from the right
of X-Forwarded-For. An address a client writes into that header itself is never trusted.
"""

import hashlib

from django.conf import settings
from django.core.cache import cache


def client_address(request) -> str:
    proxies = settings.GPUBOOK_NUM_PROXIES
    remote = request.META.get("REMOTE_ADDR", "") or "unknown"
    if proxies <= 0:
        return remote
    hops = [hop.strip() for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if hop.strip()]
    return hops[-proxies] if len(hops) >= proxies else remote


def _key(kind: str, value: str) -> str:
    digest = hashlib.sha256(value.strip().lower().encode("utf-8", "replace")).hexdigest()[:32]
    return f"gpubook:login-failures:{kind}:{digest}"


def _keys(request, username: str) -> list[tuple[str, int]]:
    return [
        (_key("address", client_address(request)), settings.GPUBOOK_LOGIN_MAX_FAILURES_PER_ADDRESS),
        (_key("username", username or ""), settings.GPUBOOK_LOGIN_MAX_FAILURES_PER_USERNAME),
    ]


def locked_out(request, username: str) -> bool:
    """True while the address or the username has used up its failures for the window."""
    counts = cache.get_many([key for key, _ in _keys(request, username)])
    return any(counts.get(key, 0) >= limit for key, limit in _keys(request, username))


def record_failure(request, username: str) -> None:
    window = settings.GPUBOOK_LOGIN_LOCKOUT_SECONDS
    for key, _ in _keys(request, username):
        if cache.add(key, 1, timeout=window):
            continue
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.add(key, 1, timeout=window)


def record_success(request, username: str) -> None:
    """A right password clears the username's count (not the address's: one success from an
    address that guesses at many accounts must not reset its budget)."""
    cache.delete(_key("username", username or ""))


LOCKED_MESSAGE = "Too many failed log-ins. Try again in a few minutes."


# --- the HTML and admin log-in forms --------------------------------------------------------------

from django import forms  # noqa: E402 — the form half of this module
from django.contrib.admin.forms import AdminAuthenticationForm  # noqa: E402
from django.contrib.auth.forms import AuthenticationForm  # noqa: E402
from django.contrib.auth.views import LoginView  # noqa: E402


class _Guarded:
    locked = False

    def clean(self):
        username = self.data.get("username", "") if hasattr(self.data, "get") else ""
        username = username if isinstance(username, str) else ""
        if locked_out(self.request, username):
            self.locked = True
            raise forms.ValidationError(LOCKED_MESSAGE, code="locked_out")
        try:
            cleaned = super().clean()
        except forms.ValidationError:
            record_failure(self.request, username)
            raise
        record_success(self.request, username)
        return cleaned


class GuardedAuthenticationForm(_Guarded, AuthenticationForm):
    pass


class GuardedAdminAuthenticationForm(_Guarded, AdminAuthenticationForm):
    pass


class GuardedLoginView(LoginView):
    authentication_form = GuardedAuthenticationForm

    def get_context_data(self, **kwargs):
        from accounts.oidc import sso_enabled

        context = super().get_context_data(**kwargs)
        # The "Sign in with …" link, shown only where single sign-on is configured.
        context["sso_provider_name"] = settings.GPUBOOK_OIDC_PROVIDER_NAME if sso_enabled() else ""
        return context

    def form_invalid(self, form):
        response = super().form_invalid(form)
        if getattr(form, "locked", False):
            response.status_code = 429
        return response
