"""An API token for a test persona, through the app's own issuing code."""


def token_for(user) -> str:
    from rest_framework.authtoken.models import Token

    return Token.objects.get_or_create(user=user)[0].key
