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
every string and on every unknown key of every object would say it at the price of the schema.

The fuzzer is given, beside a token, what no schema can carry (tests/security/fuzz_hooks.py):
working credentials for the token exchange, and booking times moved onto the rules the schema
states in words (the slot grid, end after start, the team's notice, horizon and length: a
comparison of two fields or with the clock), with a team, GPUs and bookings that exist. One case
in four still goes as generated. A last run without those hooks is the negative control: the
same operations then earn the warning, so the check and its parsing still see it."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ST = Path(sys.executable).with_name("st")
ROOT = Path(__file__).resolve().parents[2]
CHECKS = "not_a_server_error,response_schema_conformance,content_type_conformance"
# The coverage phase builds a body for every boundary of every field; a job spec's (its ~90
# allowlisted training arguments and tunable ranges, training/jobspec.py json_schema) come to
# some 1,700 requests, minutes on this box: the spec is left to the examples and fuzzing phases
# here and to tests/test_api_schema.py, which holds its schema against the spec validator.
WRITES = ["--include-method", "POST", "--include-method", "PUT", "--include-method", "PATCH"]
JOB_SPECS = ["jobs_create", "jobs_advice_create"]
RUNS = [
    ("examples,coverage", [*WRITES, *(arg for name in JOB_SPECS for arg in ("--exclude-operation-id", name))]),
    ("examples", [arg for name in JOB_SPECS for arg in ("--include-operation-id", name)]),
    ("fuzzing", WRITES),
]
# What the hooks move, and without them random credentials and times are refused (400) all but
# always. PATCH /api/v1/reservations/{id}/ too, but unhooked its random ids mostly find no booking
# (404s, no data refusals): which exist by then is the fuzzer's doing, so it is left out here.
HOOKED = {"auth_token_create": "POST /api/v1/auth/token/", "reservations_create": "POST /api/v1/reservations/",
          "series_create": "POST /api/v1/series/", "waitlist_create": "POST /api/v1/waitlist/"}
pytestmark = pytest.mark.postgres


def mismatched_operations(output: str) -> list[str]:
    """The operations listed under the warning's block in `st run`'s report."""
    block = re.search(r"^Schema validation mismatch:.*?\n\n(.*?)\n\n", output, re.MULTILINE | re.DOTALL)
    return re.findall(r"^\s+- (.+)$", block.group(1), re.MULTILINE) if block else []


def st_run(url: str, token: str, phase: str, selection: list[str], env: dict[str, str]) -> str:
    run = subprocess.run(
        [str(ST), "run", f"{url}/api/schema/", "-H", f"Authorization: Token {token}",
         "--checks", CHECKS, "--phases", phase, "--max-examples", "10", "--seed", "1", *selection,
         "--generation-allow-x00", "false", "--mode", "positive", "--workers", "1", "--no-color"],
        capture_output=True, text=True, timeout=240, cwd=ROOT, env=env,
    )
    assert re.search(r"^\s*Tested: [1-9]", run.stdout, re.MULTILINE), run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout


@pytest.mark.django_db(transaction=True, reset_sequences=True)
def test_no_operation_mostly_rejects_schema_valid_data(live_server, people, inventory, settings):
    from tests.security.tokens import token_for

    token = token_for(people["admin"])
    plain = {key: value for key, value in os.environ.items() if key != "SCHEMATHESIS_HOOKS"}
    owner = people["owner"].username
    hooked = {**plain, "SCHEMATHESIS_HOOKS": "tests.security.fuzz_hooks", "GPUBOOK_URL": live_server.url,
              "GPUBOOK_TOKEN": token, "GPUBOOK_SLOT_MINUTES": str(settings.GPUBOOK_SLOT_MINUTES),
              "GPUBOOK_FUZZ_CREDENTIALS": json.dumps({"username": owner, "password": f"pw-{owner}"})}
    for phase, selection in RUNS:
        output = st_run(live_server.url, token, phase, selection, hooked)
        assert mismatched_operations(output) == [], (phase, output[output.find("WARNINGS"):])

    # The negative control: the same fuzzing, without the hooks, on the operations they move.
    only = [arg for name in HOOKED for arg in ("--include-operation-id", name)]
    output = st_run(live_server.url, token, "fuzzing", only, plain)
    assert set(mismatched_operations(output)) == set(HOOKED.values()), output[output.find("WARNINGS"):]
