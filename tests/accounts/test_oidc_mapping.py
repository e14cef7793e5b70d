"""The single sign-on rules (accounts/oidc.py): which teams a groups claim names, and what a
sign-in does to accounts and memberships. The full redirect flow against a real provider is
tests/e2e/test_single_sign_on.py."""

import datetime as dt

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import SuspiciousOperation

from accounts.models import ExternalIdentity
from accounts.oidc import TeamRules, sso_sign_in, team_roles_from_claims
from reservations.models import Membership, Team

MEMBER, MANAGER = Membership.Role.MEMBER, Membership.Role.MANAGER
NOW = dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.UTC)
ISSUER = "https://id.example.org"


def roles(claims, **rules):
    return team_roles_from_claims(claims=claims, rules=TeamRules(**rules))


def test_a_group_named_like_a_team_makes_a_member_and_the_managers_group_a_manager():
    assert roles({"groups": ["vision", "nlp-managers"]}) == {"vision": MEMBER, "nlp": MANAGER}


def test_the_managers_group_wins_over_the_plain_one_in_either_order():
    assert roles({"groups": ["vision", "vision-managers"]}) == {"vision": MANAGER}
    assert roles({"groups": ["vision-managers", "vision"]}) == {"vision": MANAGER}


def test_a_prefix_keeps_other_groups_out_and_case_and_keycloak_slashes_do_not_matter():
    claims = {"groups": ["/GPUBOOK-Vision", "gpubook-nlp-admins", "vision", "staff"]}
    assert roles(claims, team_prefix="gpubook-", manager_suffix="-admins") == {"vision": MEMBER, "nlp": MANAGER}


def test_a_nested_claim_a_single_string_and_an_empty_suffix():
    assert roles({"realm_access": {"roles": ["vision"]}}, groups_claim="realm_access.roles") == {"vision": MEMBER}
    assert roles({"groups": "vision"}) == {"vision": MEMBER}
    assert roles({"groups": ["vision-managers"]}, manager_suffix="") == {"vision-managers": MEMBER}
    assert roles({"groups": ["-managers"]}) == {"-managers": MEMBER}  # a suffix alone names no team


def test_an_absent_claim_is_none_and_a_malformed_one_names_no_team():
    assert roles({"email": "x@example.org"}) is None
    assert roles({"realm_access": "vision"}, groups_claim="realm_access.roles") is None
    assert roles({"groups": []}) == {}
    assert roles({"groups": {"vision": True}}) == {}
    assert roles({"groups": ["vision", 7, None]}) == {"vision": MEMBER}


# --- signing in ------------------------------------------------------------------------------------


@pytest.fixture
def teams(db):
    return {slug: Team.objects.create(name=slug, slug=slug) for slug in ("vision", "nlp")}


def sign_in(claims, *, create_users=True):
    return sso_sign_in(issuer=ISSUER, claims=claims, rules=TeamRules(), create_users=create_users, now=NOW)


def memberships(user) -> dict[str, str]:
    return dict(Membership.objects.filter(user=user).values_list("team__slug", "role"))


def test_the_first_sign_in_makes_the_account_and_the_next_finds_it_by_subject(teams):
    claims = {"sub": "u-1", "preferred_username": "erin", "email": "erin@example.org", "given_name": "Erin",
              "groups": ["vision"]}
    user = sign_in(claims)
    assert (user.username, user.email, user.first_name) == ("erin", "erin@example.org", "Erin")
    assert not user.has_usable_password()
    again = sign_in({**claims, "preferred_username": "erin.renamed", "email": "erin@new.example.org"})
    assert again.pk == user.pk and again.username == "erin"  # the username stays; the address follows
    assert again.email == "erin@new.example.org"
    identity = ExternalIdentity.objects.get(user=user)
    assert (identity.issuer, identity.subject, identity.last_login_at) == (ISSUER, "u-1", NOW)


def test_each_sign_in_makes_the_memberships_those_of_the_claim(teams):
    user = sign_in({"sub": "u-1", "preferred_username": "erin", "groups": ["vision", "nlp-managers", "robotics"]})
    assert memberships(user) == {"vision": MEMBER, "nlp": MANAGER}
    sign_in({"sub": "u-1", "groups": ["vision-managers"]})
    assert memberships(user) == {"vision": MANAGER}
    sign_in({"sub": "u-1", "groups": []})
    assert memberships(user) == {}
    assert set(Team.objects.values_list("slug", flat=True)) == {"vision", "nlp"}  # no team made from a group


def test_a_provider_that_sends_no_groups_claim_leaves_memberships_alone(teams):
    user = sign_in({"sub": "u-1", "preferred_username": "erin", "groups": ["nlp"]})
    sign_in({"sub": "u-1"})
    assert memberships(user) == {"nlp": MEMBER}


def test_a_provider_account_never_takes_over_a_local_one(teams):
    local = get_user_model().objects.create_user("erin", email="erin@example.org", password="pw-erin")
    Membership.objects.create(user=local, team=teams["nlp"], role=MANAGER)
    user = sign_in({"sub": "u-1", "preferred_username": "Erin", "email": "erin@example.org", "groups": ["vision"]})
    other = sign_in({"sub": "u-2", "preferred_username": "erin", "groups": []})
    assert len({local.pk, user.pk, other.pk}) == 3
    assert (user.username, other.username) == ("Erin-2", "erin-3")
    assert memberships(local) == {"nlp": MANAGER}


def test_the_same_subject_at_another_issuer_is_another_person(teams):
    first = sign_in({"sub": "u-1", "preferred_username": "erin"})
    second = sso_sign_in(issuer="https://other.example.org", claims={"sub": "u-1", "preferred_username": "erin"},
                         rules=TeamRules(), create_users=True, now=NOW)
    assert first.pk != second.pk


def test_usernames_are_made_valid_from_what_the_claims_offer(teams):
    assert sign_in({"sub": "u-1", "preferred_username": "Erin Doe/ops"}).username == "Erin-Doe-ops"
    assert sign_in({"sub": "u-2", "email": "frank@example.org"}).username == "frank"
    assert sign_in({"sub": "a1b2c3"}).username == "a1b2c3"


def test_with_account_creation_off_only_known_identities_sign_in(teams):
    assert sign_in({"sub": "u-1", "preferred_username": "erin"}, create_users=False) is None
    assert not get_user_model().objects.filter(username="erin").exists()
    local = get_user_model().objects.create_user("erin")
    ExternalIdentity.objects.create(user=local, issuer=ISSUER, subject="u-1")  # linked by an administrator
    assert sign_in({"sub": "u-1", "groups": ["vision"]}, create_users=False).pk == local.pk
    assert memberships(local) == {"vision": MEMBER}


def test_claims_without_a_subject_are_refused(teams):
    with pytest.raises(SuspiciousOperation):
        sign_in({"preferred_username": "erin"})


# --- the backend stays out of password log-ins -------------------------------------------------------


def test_a_password_log_in_with_code_and_state_in_its_url_starts_no_token_exchange(client, people, settings):
    """The endpoints point at a closed port: any exchange attempt would raise."""
    settings.OIDC_RP_CLIENT_ID, settings.OIDC_RP_CLIENT_SECRET = "gpubook", "secret"
    for name in ("AUTHORIZATION", "TOKEN", "USER", "JWKS"):
        setattr(settings, f"OIDC_OP_{name}_ENDPOINT", "http://127.0.0.1:9/closed")
    response = client.post("/accounts/login/?code=abc&state=def", {"username": "alice", "password": "wrong"})
    assert response.status_code == 200 and "didn't match" in response.content.decode()
    response = client.post("/accounts/login/?code=abc&state=def", {"username": "alice", "password": "pw-alice"})
    assert response.status_code == 302


def test_the_callback_without_a_sign_in_under_way_goes_back_to_the_login_page(client, db, settings):
    settings.OIDC_RP_CLIENT_ID, settings.OIDC_RP_CLIENT_SECRET = "gpubook", "secret"
    settings.GPUBOOK_OIDC_ISSUER = "http://127.0.0.1:9"
    response = client.get("/accounts/oidc/callback/?code=abc&state=def", follow=True)
    assert response.redirect_chain[-1][0] == "/accounts/login/"
    assert "Single sign-on did not complete" in response.content.decode()
