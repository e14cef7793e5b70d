"""An API token for a test persona, through the app's own issuing code."""


def token_for(user) -> str:
    from django.utils import timezone

    from accounts.services import api_token_issue

    return api_token_issue(user=user, now=timezone.now())[1]
