"""Browser tests: Debian's Chromium driven by Playwright against pytest-django's live_server
(see ../shared/recipes/browser-tests.md). Run on their own with `pytest -m e2e tests/e2e`."""

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


@pytest.fixture
def open_page(browser, live_server):
    """A logged-in page for a persona, through the real login form. The browser runs in
    New York while the user's profile says Berlin: pages must follow the profile."""
    contexts = []

    def make(username: str, *, javascript: bool = True):
        context = browser.new_context(
            viewport=LAPTOP, timezone_id="America/New_York", locale="en-GB", java_script_enabled=javascript
        )
        contexts.append(context)
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
        context.close()
