"""Single sign-on with OpenID Connect (README "Single sign-on"): mozilla-django-oidc does the
authorization-code flow; this module decides who the person is and which teams they are in.

- A provider account is found again by its issuer and `sub` (accounts.models.ExternalIdentity),
  never by e-mail, so it cannot take over a local account that shares an address.
- The groups claim decides team membership on every sign-in: `<prefix><team-slug>` makes a
  member, `<prefix><team-slug><manager suffix>` a manager. Teams are never created from it
  (quotas are an administrator's decision); groups naming no team are ignored. When the claim
  is absent altogether, memberships are left as they are: a provider not configured to send
  it must not empty everyone's teams.
- Everything is off until the environment configures it (config/settings.py); local accounts
  (ModelBackend) keep working either way.
"""

import datetime as dt
import logging
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.db import transaction
from django.utils import timezone
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from accounts.models import ExternalIdentity
from reservations.models import Membership, Team

logger = logging.getLogger(__name__)


# --- configuration --------------------------------------------------------------------------------


def sso_enabled() -> bool:
    return bool(settings.OIDC_RP_CLIENT_ID)


@dataclass(frozen=True)
class Endpoints:
    authorization: str
    token: str
    userinfo: str
    jwks: str


_DISCOVERY_SECONDS = 3600  # keys and endpoints rotate rarely; a restart also re-reads them
_discovered: dict[str, tuple[float, dict]] = {}
_discovery_lock = threading.Lock()


def _discovery(issuer: str) -> dict:
    """The provider's discovery document, fetched on first use (never at start-up: the app must
    start while the provider is down) and kept for an hour."""
    with _discovery_lock:
        cached = _discovered.get(issuer)
        if cached and time.monotonic() - cached[0] < _DISCOVERY_SECONDS:
            return cached[1]
    response = requests.get(f"{issuer}/.well-known/openid-configuration", timeout=settings.OIDC_TIMEOUT)
    response.raise_for_status()
    document = response.json()
    if document.get("issuer", "").rstrip("/") != issuer:  # OpenID Connect Discovery 1.0, §4.3
        raise ImproperlyConfigured(f"the discovery document of {issuer} names issuer {document.get('issuer')!r}")
    with _discovery_lock:
        _discovered[issuer] = (time.monotonic(), document)
    return document


def endpoints() -> Endpoints:
    """Explicit GPUBOOK_OIDC_*_ENDPOINT settings win; the rest come from the issuer's discovery."""
    explicit = Endpoints(
        authorization=settings.OIDC_OP_AUTHORIZATION_ENDPOINT, token=settings.OIDC_OP_TOKEN_ENDPOINT,
        userinfo=settings.OIDC_OP_USER_ENDPOINT, jwks=settings.OIDC_OP_JWKS_ENDPOINT,
    )
    if all(vars(explicit).values()):
        return explicit
    document = _discovery(settings.GPUBOOK_OIDC_ISSUER)
    return Endpoints(
        authorization=explicit.authorization or document["authorization_endpoint"],
        token=explicit.token or document["token_endpoint"],
        userinfo=explicit.userinfo or document["userinfo_endpoint"],
        jwks=explicit.jwks or document["jwks_uri"],
    )


# --- the mapping rule -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TeamRules:
    """How the groups claim names teams (GPUBOOK_OIDC_GROUPS_CLAIM, _TEAM_PREFIX, _MANAGER_SUFFIX)."""

    groups_claim: str = "groups"
    team_prefix: str = ""
    manager_suffix: str = "-managers"

    @classmethod
    def from_settings(cls) -> "TeamRules":
        return cls(groups_claim=settings.GPUBOOK_OIDC_GROUPS_CLAIM, team_prefix=settings.GPUBOOK_OIDC_TEAM_PREFIX,
                   manager_suffix=settings.GPUBOOK_OIDC_MANAGER_SUFFIX)


def _claim(claims: Mapping[str, Any], path: str) -> Any:
    """`realm_access.roles` reads a nested claim (Keycloak puts roles there)."""
    value: Any = claims
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def team_roles_from_claims(*, claims: Mapping[str, Any], rules: TeamRules) -> dict[str, str] | None:
    """{team slug: role} the claims ask for, whether or not such teams exist; None when the
    groups claim is absent (then memberships are left alone)."""
    raw = _claim(claims, rules.groups_claim)
    if raw is None:
        return None
    groups = [raw] if isinstance(raw, str) else [g for g in raw if isinstance(g, str)] if isinstance(raw, list) else []
    roles: dict[str, str] = {}
    for group in groups:
        name = group.strip().lstrip("/").lower()  # Keycloak sends "/group" with full paths on
        prefix = rules.team_prefix.lower()
        if not name.startswith(prefix):
            continue
        name = name[len(prefix):]
        suffix = rules.manager_suffix.lower()
        if suffix and name.endswith(suffix) and len(name) > len(suffix):
            roles[name[: -len(suffix)]] = Membership.Role.MANAGER
        elif name:
            roles.setdefault(name, Membership.Role.MEMBER)  # a manager group wins over the plain one
    return roles


def sync_team_memberships(*, user: AbstractBaseUser, wanted: Mapping[str, str]) -> dict[str, str]:
    """Make `user`'s memberships exactly the existing teams of `wanted`, with those roles.
    Returns {slug: role} as applied (slugs naming no team left out)."""
    teams = {team.slug: team for team in Team.objects.filter(slug__in=list(wanted))}
    Membership.objects.filter(user=user).exclude(team__in=teams.values()).delete()
    for slug, team in teams.items():
        Membership.objects.update_or_create(team=team, user=user, defaults={"role": wanted[slug]})
    unknown = sorted(set(wanted) - set(teams))
    if unknown:
        logger.info("single sign-on: %s's groups name no team: %s", user.get_username(), ", ".join(unknown))
    return {slug: wanted[slug] for slug in teams}


_USERNAME_UNSAFE = re.compile(r"[^\w.@+-]")


def _free_username(claims: Mapping[str, Any]) -> str:
    """preferred_username, else the e-mail's local part, else the subject; made valid for
    Django and suffixed -2, -3… while a (local or other) account already has it."""
    email = claims.get("email") or ""
    base = claims.get("preferred_username") or email.partition("@")[0] or claims["sub"]
    base = _USERNAME_UNSAFE.sub("-", str(base))[:140] or "user"
    User = get_user_model()
    candidate, n = base, 1
    while User.objects.filter(username__iexact=candidate).exists():
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def sso_sign_in(
    *, issuer: str, claims: Mapping[str, Any], rules: TeamRules, create_users: bool, now: dt.datetime
) -> AbstractBaseUser | None:
    """The user behind verified provider claims: found by (issuer, sub), else created (when
    allowed); profile fields and team memberships follow the claims. None: no such user and
    creating users is off."""
    subject = claims.get("sub")
    if not subject or not isinstance(subject, str):
        raise SuspiciousOperation("the provider's claims carry no subject")
    User = get_user_model()
    with transaction.atomic():
        identity = ExternalIdentity.objects.select_related("user").filter(issuer=issuer, subject=subject).first()
        if identity is None:
            if not create_users:
                return None
            user = User.objects.create_user(_free_username(claims), password=None)  # no usable password
            identity = ExternalIdentity.objects.create(
                user=user, issuer=issuer, subject=subject, created_at=now, last_login_at=now
            )
        user = identity.user
        user.email = str(claims.get("email") or user.email)[:254]
        user.first_name = str(claims.get("given_name") or user.first_name)[:150]
        user.last_name = str(claims.get("family_name") or user.last_name)[:150]
        user.save(update_fields=["email", "first_name", "last_name"])
        identity.last_login_at = now
        identity.save(update_fields=["last_login_at"])
        wanted = team_roles_from_claims(claims=claims, rules=rules)
        if wanted is None:
            logger.warning("single sign-on: no %r claim for %s; team memberships left as they are",
                           rules.groups_claim, user.get_username())
        else:
            sync_team_memberships(user=user, wanted=wanted)
    return user


# --- the authentication backend (mozilla-django-oidc) ----------------------------------------------


class OidcBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's code flow, with endpoints resolved at sign-in (so the backend costs
    nothing on password log-ins and the app starts while the provider is down), the ID token's
    audience and issuer checked, and users found and mapped by sso_sign_in."""

    def __init__(self, *args, **kwargs):
        self.UserModel = get_user_model()  # settings are read per sign-in, in authenticate()

    def authenticate(self, request, **kwargs):
        # Only the callback view passes a nonce: a password form posted with ?code=…&state=…
        # in its URL must never start a token exchange.
        if "nonce" not in kwargs or not sso_enabled():
            return None
        found = endpoints()
        self.OIDC_OP_TOKEN_ENDPOINT, self.OIDC_OP_USER_ENDPOINT = found.token, found.userinfo
        self.OIDC_OP_JWKS_ENDPOINT = found.jwks
        self.OIDC_RP_CLIENT_ID, self.OIDC_RP_CLIENT_SECRET = settings.OIDC_RP_CLIENT_ID, settings.OIDC_RP_CLIENT_SECRET
        self.OIDC_RP_SIGN_ALGO, self.OIDC_RP_IDP_SIGN_KEY = settings.OIDC_RP_SIGN_ALGO, None
        return super().authenticate(request, **kwargs)

    def get_or_create_user(self, access_token, id_token, payload):
        # `payload` is the ID token, its signature, expiry and nonce checked by the library;
        # the audience and issuer it leaves unchecked.
        audience = payload.get("aud")
        if self.OIDC_RP_CLIENT_ID not in (audience if isinstance(audience, list) else [audience]):
            raise SuspiciousOperation("the ID token is not meant for this client")
        issuer = str(payload.get("iss", "")).rstrip("/")
        if settings.GPUBOOK_OIDC_ISSUER and issuer != settings.GPUBOOK_OIDC_ISSUER:
            raise SuspiciousOperation("the ID token comes from another issuer")
        userinfo = self.get_userinfo(access_token, id_token, payload)
        if userinfo.get("sub") != payload.get("sub"):  # OpenID Connect Core 1.0, §5.3.2
            raise SuspiciousOperation("the userinfo answer is about another subject")
        return sso_sign_in(
            issuer=issuer, claims={**payload, **userinfo}, rules=TeamRules.from_settings(),
            create_users=settings.OIDC_CREATE_USER, now=timezone.now(),
        )

    def get_user(self, user_id):
        # ModelBackend's, not the library's: a deactivated user's session ends, as with passwords.
        return ModelBackend.get_user(self, user_id)
