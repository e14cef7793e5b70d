"""A schema-driven fuzzer (schemathesis) over the whole OpenAPI: every operation, as an admin
with a token and as an anonymous caller, must never answer a 5xx, and what it answers must
conform to the schema (response body and content type). Sized for CI: a few examples per
operation and per caller (FUZZ_EXAMPLES), about a minute on two cores. It runs in `make test`'s
PostgreSQL pass (the production database, and the stricter one about text and integer ranges);
the SQLite repeat of the suite leaves it out to keep CI's budget."""

import collections
import os

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

FUZZ_EXAMPLES = int(os.environ.get("GPUBOOK_FUZZ_EXAMPLES", "6"))
CHECKS = [not_a_server_error, response_schema_conformance, content_type_conformance]
pytestmark = pytest.mark.postgres

# The WSGI test transport does not undo GZipMiddleware's compression, as real clients do.
PLAIN = {"Accept-Encoding": "identity"}
CASES: collections.Counter = collections.Counter()  # requests sent, by caller: tests/security/conftest.py prints them

@pytest.fixture
def api_schema(db):
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    from config.wsgi import application

    # Requests go through the real WSGI app inside the test's transaction; like Django's test
    # client, keep the end of a request from closing that connection.
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    yield schemathesis.openapi.from_wsgi("/api/schema/", application)
    for signal in (request_started, request_finished):
        signal.connect(close_old_connections)


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture
def admin_token(people, inventory):
    from reservations.models import Reservation  # noqa: F401 — the app registry is ready here
    from tests.security.tokens import token_for

    return token_for(people["admin"])


@pytest.mark.django_db
@schema.parametrize()
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_api_as_an_admin(case, admin_token):
    CASES["admin"] += 1
    case.call_and_validate(headers={"Authorization": f"Token {admin_token}", **PLAIN}, checks=CHECKS)


@pytest.mark.django_db
@schema.parametrize()
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_api_anonymous(case, people, inventory):
    CASES["anonymous"] += 1
    case.call_and_validate(headers=PLAIN, checks=CHECKS)
