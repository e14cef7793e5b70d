"""The schemathesis CLI (`st run`, as an API user would run it) against a live server, with the
fuzzer's conformance checks: no operation may earn its "Schema validation mismatch" warning.

schemathesis raises that warning for an operation when, in one phase, none of the requests it
built as schema-valid was served and at least a tenth of the 4xx answers were refusals of the
data itself (anything but 401, 403, 404, 409 and 429): the sign that the schema lets through data
the API refuses. The write operations are the ones with bodies to get wrong (POST, PUT, PATCH;
DELETE has none), and only schema-valid ("positive") requests are built: the warning looks at
nothing else.

Two runs on one server, so the second meets the bookings and jobs the first made: the examples
and coverage phases, whose requests are built from the schema's constraints and examples
(config/openapi.py), then the fuzzing phase's random ones. Strings carry no NUL
(`--generation-allow-x00 false`): the API refuses NUL anywhere in a body (config/parsers.py,
PostgreSQL text cannot hold it), a rule the schema states in words only, since a pattern on
every string and on every unknown key of every object would say it at the price of the schema."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ST = Path(sys.executable).with_name("st")
CHECKS = "not_a_server_error,response_schema_conformance,content_type_conformance"
# Known and reported, not accepted: wrong credentials are refused with 400 (as OAuth's token
# endpoint answers invalid_grant), and no schema can carry credentials that work.
STILL_MISMATCHED = {"POST /api/v1/auth/token/"}
# A random booking time is, all but always, refused for what no OpenAPI 3.0 schema can state:
# it must end after it starts (a comparison of two fields), lie in the future, past the team's
# notice and inside its horizon (a comparison with the clock), and on the slot grid in UTC
# whatever offset it is written with. The examples and coverage phases, built from the schema's
# examples, book, change and wait successfully (the first run above).
TIMED = {"POST /api/v1/reservations/", "PATCH /api/v1/reservations/{id}/", "POST /api/v1/series/",
         "POST /api/v1/waitlist/"}
# The coverage phase builds a body for every boundary of every field; a job spec's (its ~90
# allowlisted training arguments and tunable ranges, training/jobspec.py json_schema) come to
# some 1,700 requests, minutes on this box: the spec is left to the examples and fuzzing phases
# here and to tests/test_api_schema.py, which holds its schema against the spec validator.
WRITES = ["--include-method", "POST", "--include-method", "PUT", "--include-method", "PATCH"]
JOB_SPECS = ["jobs_create", "jobs_advice_create"]
RUNS = [
    ("examples,coverage", [*WRITES, *(arg for name in JOB_SPECS for arg in ("--exclude-operation-id", name))],
     STILL_MISMATCHED),
    ("examples", [arg for name in JOB_SPECS for arg in ("--include-operation-id", name)], set()),
    ("fuzzing", WRITES, STILL_MISMATCHED | TIMED),
]
pytestmark = pytest.mark.postgres


def mismatched_operations(output: str) -> list[str]:
    """The operations listed under the warning's block in `st run`'s report."""
    block = re.search(r"^Schema validation mismatch:.*?\n\n(.*?)\n\n", output, re.MULTILINE | re.DOTALL)
    return re.findall(r"^\s+- (.+)$", block.group(1), re.MULTILINE) if block else []


@pytest.mark.django_db(transaction=True, reset_sequences=True)
def test_no_operation_mostly_rejects_schema_valid_data(live_server, people, inventory):
    from tests.security.tokens import token_for

    token = token_for(people["admin"])
    for phase, selection, allowed in RUNS:
        run = subprocess.run(
            [str(ST), "run", f"{live_server.url}/api/schema/", "-H", f"Authorization: Token {token}",
             "--checks", CHECKS, "--phases", phase, "--max-examples", "10", "--seed", "1", *selection,
             "--generation-allow-x00", "false", "--mode", "positive", "--workers", "1", "--no-color"],
            capture_output=True, text=True, timeout=240,
        )
        summary = run.stdout[run.stdout.find("WARNINGS"):]
        assert "Tested:" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]
        assert set(mismatched_operations(run.stdout)) <= allowed, (phase, summary)
