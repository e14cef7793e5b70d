"""Single sign-on in a real Chromium against a real OpenID Provider (django-oidc-provider in a
second process on loopback, tests/oidc_op): gpubook's login page → the provider's login form →
its consent page → back in gpubook, signed in, the account made and its teams taken from the
groups claim. Everything runs under gpubook's Content-Security-Policy."""

import json
import selectors
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from accounts.models import ExternalIdentity
from reservations.models import Membership
from tests.e2e.conftest import LAPTOP, watch_csp

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CLIENT_ID, CLIENT_SECRET = "gpubook-test", "a-client-secret-for-tests"


@pytest.fixture
def oidc_provider(live_server, tmp_path, settings):
    """The provider, with one person whose username and e-mail are those of the local user
    alice (tests/support.py), and gpubook configured for it through its issuer alone."""
    spec = {
        "database": str(tmp_path / "op.sqlite3"), "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET,
        "redirect_uri": f"{live_server.url}/accounts/oidc/callback/",
        "users": [{"username": "alice", "password": "op-password", "email": "alice@example.org",
                   "given_name": "Alice", "family_name": "Provider",
                   "groups": ["vision", "nlp-managers", "robotics"]}],
    }
    log = (tmp_path / "op.log").open("w")
    process = subprocess.Popen([sys.executable, "-m", "tests.oidc_op.serve", json.dumps(spec)], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        with selectors.DefaultSelector() as selector:  # its one line says it is ready
            selector.register(process.stdout, selectors.EVENT_READ)
            if not selector.select(timeout=30):
                pytest.fail(f"the OpenID Provider did not start: {(tmp_path / 'op.log').read_text()}")
            line = process.stdout.readline()
        if not line:
            pytest.fail(f"the OpenID Provider exited: {(tmp_path / 'op.log').read_text()}")
        issuer = json.loads(line)["issuer"]
        settings.GPUBOOK_OIDC_ISSUER = issuer
        settings.OIDC_RP_CLIENT_ID, settings.OIDC_RP_CLIENT_SECRET = CLIENT_ID, CLIENT_SECRET
        settings.GPUBOOK_OIDC_PROVIDER_NAME = "Test IdP"
        yield issuer
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


def test_sign_in_through_the_provider_makes_the_account_and_its_teams(
    browser, live_server, people, oidc_provider, csp_violations, screenshots
):
    local_alice = people["owner"]
    local_alice.email = "alice@example.org"
    local_alice.save()
    context = browser.new_context(viewport=LAPTOP)
    watch_csp(context, csp_violations)
    page = context.new_page()
    page.set_default_timeout(15_000)
    started = time.monotonic()

    page.goto(f"{live_server.url}/reservations/")
    assert "/accounts/login/" in page.url
    assert page.get_by_label("Password").is_visible()  # local accounts keep their form
    page.screenshot(path=str(screenshots / "sso-login-page.png"))
    page.get_by_role("link", name="Sign in with Test IdP").click()

    page.wait_for_url(f"{oidc_provider}/login/**")
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("op-password")
    page.get_by_role("button", name="Sign in").click()

    page.wait_for_url(f"{oidc_provider}/authorize**")  # consent: the provider asks
    assert page.get_by_text("Groups", exact=True).is_visible()
    page.get_by_role("button", name="Authorize").click()

    page.wait_for_url(f"{live_server.url}/reservations/")  # back where the person was going
    page.screenshot(path=str(screenshots / "sso-signed-in.png"))
    header = page.locator(".site-user").inner_text()
    elapsed = time.monotonic() - started

    identity = ExternalIdentity.objects.select_related("user").get(issuer=oidc_provider)
    user = identity.user
    # The provider's alice is not the local alice, whatever their shared name and address.
    assert user != local_alice and user.username == "alice-2"
    assert "alice-2" in header
    assert (user.email, user.first_name, user.last_name) == ("alice@example.org", "Alice", "Provider")
    assert not user.has_usable_password()
    roles = dict(Membership.objects.filter(user=user).values_list("team__slug", "role"))
    assert roles == {"vision": Membership.Role.MEMBER, "nlp": Membership.Role.MANAGER}  # no robotics team
    assert Membership.objects.filter(user=local_alice).count() == 1
    assert get_user_model().objects.filter(username__startswith="alice").count() == 2
    assert elapsed < 30
    context.close()


def test_local_accounts_still_log_in_with_a_password(browser, live_server, people, oidc_provider, csp_violations):
    context = browser.new_context(viewport=LAPTOP)
    watch_csp(context, csp_violations)
    page = context.new_page()
    page.goto(f"{live_server.url}/accounts/login/")
    assert page.get_by_role("link", name="Sign in with Test IdP").is_visible()
    page.get_by_label("Username").fill("bob")
    page.get_by_label("Password").fill("pw-bob")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{live_server.url}/calendar/**")
    assert "bob" in page.locator(".site-user").inner_text()
    assert not ExternalIdentity.objects.exists()
    context.close()


def test_the_login_page_offers_no_provider_when_none_is_configured(browser, live_server, people, csp_violations):
    context = browser.new_context(viewport=LAPTOP)
    page = context.new_page()
    page.goto(f"{live_server.url}/accounts/login/")
    assert page.get_by_role("button", name="Log in").is_visible()
    assert page.get_by_text("Sign in with").count() == 0
    assert page.goto(f"{live_server.url}/accounts/oidc/authenticate/").status == 404
    context.close()
