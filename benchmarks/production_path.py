"""Benchmark: the production path on the wire. gunicorn with DEBUG=false and collected static
files (WhiteNoise), the busy week of benchmarks/calendar_events.py (64 GPUs, 2,000 bookings).

Run from the repository root:  .venv/bin/python benchmarks/production_path.py
It creates its own PostgreSQL database (DATABASE_URL, default
postgres://postgres@127.0.0.1:5432/gpubook_bench_production), migrates it, serves it with
gunicorn on a kernel-chosen 127.0.0.1 port, and drops the database afterwards.

Figures printed:
- bytes on the wire for the calendar page (HTML, and HTML + its CSS/JS) and for the week's
  events feed, uncompressed (what a client without Accept-Encoding gets, and what every
  client got before compression) against gzip, and a repeated feed request with its ETag (304);
- time to first calendar paint in headless Chromium (navigation start → the first frame with
  the GPU rows, and with the bookings), cold cache and warm cache, median of RUNS loads.
"""

import datetime as dt
import os
import pathlib
import re
import statistics
import sys
import tempfile
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpubook_bench_production")
os.environ.setdefault("SECRET_KEY", "gpubook-benchmark-only-" + "x" * 40)
os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("GPUBOOK_STATIC_MANIFEST", "false")  # this process only builds the fixture

from benchmarks.calendar_events import DAYS, build_fixture, create_database, drop_database  # noqa: E402
from tests.e2e.conftest import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from tests.e2e.production import collectstatic, production_env, production_stack  # noqa: E402

RUNS = 7
PAINT_SCRIPT = """
window.__paint = {};
new MutationObserver((_, observer) => {
    for (const [name, selector] of [["rows", ".ec-sidebar .ec-row-head"], ["events", ".ec-event"]]) {
        if (!window.__paint[name] && document.querySelector(selector)) {
            window.__paint[name] = -1;
            requestAnimationFrame(() => {
                window.__paint[name] = performance.now();
                // A mark the benchmark waits for: the page's CSP (script-src 'self') forbids the
                // eval that Playwright's wait_for_function needs, not a selector wait.
                if (window.__paint.rows > 0 && window.__paint.events > 0) {
                    document.documentElement.dataset.painted = "";
                }
            });
        }
    }
}).observe(document, {childList: true, subtree: true});
"""


def fetch(url: str, cookie: str, encoding: str, etag: str = "") -> tuple[int, int, dict]:
    headers = {"Cookie": cookie, "Accept-Encoding": encoding}
    if etag:
        headers["If-None-Match"] = etag
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 — loopback
    try:
        with urllib.request.urlopen(request) as response:  # noqa: S310 — loopback
            return response.status, len(response.read()), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, len(error.read()), dict(error.headers)


def kib(n: int) -> str:
    return f"{n / 1024:8.1f} KiB"


def main() -> int:
    url = os.environ["DATABASE_URL"]
    create_database(url)
    try:
        import django

        django.setup()
        from django.contrib.auth.hashers import PBKDF2PasswordHasher
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        week_start = dt.datetime(2030, 3, 4, tzinfo=dt.UTC)
        fixture = build_fixture(week_start)
        hasher = PBKDF2PasswordHasher()
        fixture["alice"].password = hasher.encode("bench-pw", hasher.salt(), iterations=1000)
        fixture["alice"].save(update_fields=["password"])
        from django.db import connections

        connections.close_all()

        with tempfile.TemporaryDirectory() as tmp:
            tmp_path = pathlib.Path(tmp)
            env = production_env(database_url=url, redis_url="", var_dir=tmp_path / "var",
                                 static_root=tmp_path / "static")
            collectstatic(env)
            with production_stack(env, tmp_path, celery=False) as base:
                return measure(base, week_start)
    finally:
        drop_database(url)


def measure(base: str, week_start: dt.datetime) -> int:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1440, "height": 900})
        page = context.new_page()
        page.goto(f"{base}/accounts/login/")
        page.get_by_label("Username").fill("alice")
        page.get_by_label("Password").fill("bench-pw")
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(f"{base}/calendar/**")
        cookie = "; ".join(f"{c['name']}={c['value']}" for c in context.cookies())
        storage = context.storage_state()
        context.close()

        calendar_url = f"{base}/calendar/?view=week&date={week_start.date().isoformat()}"
        # The feed as the calendar asks for it: the week in the viewer's wall clock (Berlin).
        local = week_start.replace(tzinfo=None)
        feed_url = (f"{base}/calendar/events.json?start={local:%Y-%m-%dT%H:%M:%S}"
                    f"&end={local + dt.timedelta(days=DAYS):%Y-%m-%dT%H:%M:%S}")
        rows = []
        status, html_plain, _ = fetch(calendar_url, cookie, "identity")
        assert status == 200, status
        _, html_gzip, headers = fetch(calendar_url, cookie, "gzip")
        assert headers.get("Content-Encoding") == "gzip"
        rows.append(("calendar page HTML", html_plain, html_gzip))
        html = urllib.request.urlopen(urllib.request.Request(calendar_url, headers={"Cookie": cookie})).read()  # noqa: S310
        assets = re.findall(rb'(?:href|src)="(/static/[^"]+\.(?:css|js))"', html)
        assets_plain = sum(fetch(base + a.decode(), "", "identity")[1] for a in assets)
        assets_gzip = sum(fetch(base + a.decode(), "", "gzip")[1] for a in assets)
        rows.append((f"calendar page + {len(assets)} CSS/JS", html_plain + assets_plain, html_gzip + assets_gzip))
        status, feed_plain, _ = fetch(feed_url, cookie, "identity")
        assert status == 200, status
        _, feed_gzip, feed_headers = fetch(feed_url, cookie, "gzip")
        assert feed_headers.get("Content-Encoding") == "gzip"
        rows.append(("events feed, busy week", feed_plain, feed_gzip))
        status_304, bytes_304, _ = fetch(feed_url, cookie, "gzip", etag=feed_headers["ETag"])
        assert status_304 == 304, status_304

        print("bytes on the wire            uncompressed        gzip   ratio")
        for name, plain, gzipped in rows:
            print(f"  {name:<28}{kib(plain)}  {kib(gzipped)}   {plain / gzipped:4.1f}×")
        print(f"  events feed, repeated with If-None-Match: {status_304}, {bytes_304} bytes of body")

        def load(context) -> dict:
            page = context.new_page()
            page.goto(calendar_url)
            page.wait_for_selector("html[data-painted]", state="attached", timeout=90_000)
            figures = page.evaluate("window.__paint")
            page.close()
            return figures

        cold, warm = [], []
        for _ in range(RUNS):
            context = browser.new_context(viewport={"width": 1440, "height": 900}, storage_state=storage)
            context.add_init_script(PAINT_SCRIPT)
            cold.append(load(context))
            warm.append(load(context))  # same context: hashed static files come from the cache
            context.close()
        browser.close()

    print(f"first calendar paint in Chromium, median of {RUNS} loads (navigation start →)")
    for name, samples in (("cold cache", cold), ("warm cache", warm)):
        print(f"  {name}: GPU rows {statistics.median(s['rows'] for s in samples):6.0f} ms;"
              f" bookings {statistics.median(s['events'] for s in samples):6.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
