"""DRF authentication by `Authorization: Token <key>` against accounts.ApiToken."""

from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication

from accounts.services import api_token_user


class ApiTokenAuthentication(TokenAuthentication):
    keyword = "Token"

    def authenticate_credentials(self, key):
        found = api_token_user(key=key, now=timezone.now())
        if found is None:
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked token.")
        return found
