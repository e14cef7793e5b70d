"""Browser tests: Debian's Chromium driven by Playwright against pytest-django's live_server
(see ../shared/recipes/browser-tests.md). Run on their own with `pytest -m e2e tests/e2e`."""

import contextlib
import os
import pathlib
import shutil

import pytest

# Django's live server thread and Playwright's sync API share one process; Django would
# otherwise refuse ORM calls from what it takes for an async context.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = os.environ.get("GPUBOOK_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = pathlib.Path(__file__).resolve().parents[2] / "build" / "screenshots"
LAPTOP = {"width": 1440, "height": 900}


@pytest.fixture(scope="session")
def browser():
    if not shutil.which(CHROMIUM) and not pathlib.Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM}: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def screenshots() -> pathlib.Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS


# Playwright's init scripts run outside the page's Content-Security-Policy, so this listener
# sees every violation the policy reports, including those of scripts it blocked.
CSP_LISTENER = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", function (event) {
  window.__cspViolations.push(event.violatedDirective + " " + event.blockedURI);
});
"""


def watch_csp(context, violations: list[str]) -> None:
    """Record CSP violations of every page of `context`: console messages and DOM events."""
    context.add_init_script(CSP_LISTENER)

    def on_page(page):
        page.on("console", lambda message: "Content Security Policy" in message.text
                and violations.append(message.text))
    context.on("page", on_page)


@pytest.fixture
def csp_violations():
    """Every test that opens pages ends by checking that none of them broke the CSP."""
    violations: list[str] = []
    yield violations
    if violations:
        pytest.fail(f"Content-Security-Policy violations: {violations}")


@pytest.fixture
def open_page(browser, live_server, csp_violations):
    """A logged-in page for a persona, through the real login form. The browser runs in
    New York while the user's profile says Berlin: pages must follow the profile.
    Content-Security-Policy violations on any page fail the test (csp_violations)."""
    contexts = []

    def make(username: str, *, javascript: bool = True):
        context = browser.new_context(
            viewport=LAPTOP, timezone_id="America/New_York", locale="en-GB", java_script_enabled=javascript
        )
        contexts.append(context)
        watch_csp(context, csp_violations)
        page = context.new_page()
        page.set_default_timeout(10_000)
        page.goto(f"{live_server.url}/calendar/")
        assert "/accounts/login/" in page.url  # every page needs a login
        page.get_by_label("Username").fill(username)
        page.get_by_label("Password").fill(f"pw-{username}")
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(f"{live_server.url}/calendar/**")
        return page

    yield make
    for context in contexts:
        for page in context.pages:
            # A page closed mid-navigation has nothing more to add.
            with contextlib.suppress(Exception):
                csp_violations.extend(page.evaluate("window.__cspViolations || []"))
        context.close()
