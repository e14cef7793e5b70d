"""Test settings: the production settings with a throwaway secret and fast password hashing.
The database still comes from DATABASE_URL, so the same suite runs on PostgreSQL and SQLite."""

import os

os.environ.setdefault("SECRET_KEY", "gpubook-tests-only")
os.environ.setdefault("DEBUG", "false")
# Hashed static names need `collectstatic` first; the production smoke test (tests/e2e) does that.
os.environ.setdefault("GPUBOOK_STATIC_MANIFEST", "false")

from config.settings import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
REST_FRAMEWORK = {**REST_FRAMEWORK, "DEFAULT_THROTTLE_CLASSES": []}  # noqa: F405
# Throttle and lockout counts stay in this process (never a shared Redis between checkouts);
# tests/conftest.py clears them between tests.
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
# The suite runs command jobs with the local executor as the test's own user (the isolation
# and the refusal are tested with their settings changed: tests/security/test_job_isolation.py).
GPUBOOK_SINGLE_USER = True
