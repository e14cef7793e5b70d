"""The two single sign-on pages (mozilla-django-oidc's views): /accounts/oidc/authenticate/
sends the browser to the provider, /accounts/oidc/callback/ takes it back. Both answer 404
while single sign-on is not configured.

The login page reaches the first with a plain link, not a form: Chromium applies the CSP's
`form-action 'self'` to the redirects that follow a form submission, so a form posting here
would be blocked on its way to the provider."""

import logging

import requests
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ImproperlyConfigured
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import resolve_url
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from accounts.oidc import endpoints, sso_enabled

logger = logging.getLogger(__name__)
FAILED = "Single sign-on did not complete. Try again, or log in with a password."


class SsoStartView(OIDCAuthenticationRequestView):
    def __init__(self, **kwargs):
        super(OIDCAuthenticationRequestView, self).__init__(**kwargs)  # settings are read per request

    def get(self, request):
        if not sso_enabled():
            raise Http404("single sign-on is not configured")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = endpoints().authorization
        except (requests.RequestException, ValueError, KeyError, ImproperlyConfigured) as error:
            logger.error("single sign-on: the provider's discovery document is unusable: %s", error)
            messages.error(request, FAILED)
            return HttpResponseRedirect(resolve_url(settings.LOGIN_URL))
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        return super().get(request)


class SsoCallbackView(OIDCAuthenticationCallbackView):
    def get(self, request):
        if not sso_enabled():
            raise Http404("single sign-on is not configured")
        try:
            return super().get(request)
        except (requests.RequestException, ValueError, KeyError, ImproperlyConfigured) as error:
            logger.error("single sign-on: the provider did not complete the sign-in: %s", error)
            return self.login_failure()

    def login_failure(self):
        messages.error(self.request, FAILED)
        return super().login_failure()
