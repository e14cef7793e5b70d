"""schemathesis hooks for `st run` (loaded through SCHEMATHESIS_HOOKS by
tests/security/test_schema_conformance_cli.py): they give the fuzzer what no OpenAPI 3.0 schema
can carry, as it is given a token header, and nothing else.

What exists and what the clock says. Three cases in four of these operations are moved onto the
rules below, the values derived from the generated ones (a hash picks the slot, the length, the
GPUs), so variety stays; the fourth goes as generated, so the refusals are still exercised.

- POST /api/v1/auth/token/: working credentials (a persona's, passed in by the test). Wrong ones
  stay a 400 invalid_credentials (accounts/api.py TokenView), as OAuth 2.0's token endpoint
  answers a wrong resource-owner password (RFC 6749 5.2, invalid_grant) and DRF's
  obtain_auth_token does: a 401 must carry a challenge for an HTTP authentication scheme
  (RFC 7235 3.1, WWW-Authenticate) and this endpoint takes none, and everywhere else in the API
  a 401 means "your token is missing or dead", which a client answers by logging in again.
  Guessing is slowed by config/login_guard.py.
- POST /api/v1/reservations/, PATCH /api/v1/reservations/{id}/, POST /api/v1/series/: a window
  under reservations/services.py `_validate_times` (the end after the start; both on the slot
  grid in UTC, `timegrid.is_on_grid` with settings.GPUBOOK_SLOT_MINUTES, whatever offset they
  are written with: the generated one is kept) and `_validate_team_rules` (not in a slot that has
  begun, the team's `min_notice_minutes` ahead, at most its `max_days_ahead` days ahead, at most
  its `max_booking_hours` long), the team's rules read from GET /api/v1/teams/ as they are now
  (the fuzzer changes them too); a team and GPUs of one node that exist (services._resolve_gpus),
  and for a change a booking that exists and has not begun.
- POST /api/v1/series/ also: an RRULE that parses and ends (reservations/recurring.py
  `occurrences`) and an IANA zone name (`series_create`); each occurrence is then booked under
  the rules above, its refusals reported in the series' `failed`.
- POST /api/v1/waitlist/: a slot that is taken now, an upcoming booking's
  (reservations/waitlist.py `waitlist_join`: a free slot is refused, 409 slot_free).
- PATCH /api/v1/teams/{id}/: an IANA zone name for `time_zone` (reservations/models.py
  `validate_time_zone`; the schema says so in words)."""

import datetime as dt
import hashlib
import json
import os
import zoneinfo

import requests
import schemathesis
from schemathesis.generation import GenerationMode

from reservations import timegrid

API = os.environ["GPUBOOK_URL"].rstrip("/") + "/api/v1"
HEADERS = {"Authorization": f"Token {os.environ['GPUBOOK_TOKEN']}"}
SLOT_MINUTES = int(os.environ["GPUBOOK_SLOT_MINUTES"])  # the server's settings.GPUBOOK_SLOT_MINUTES
CREDENTIALS = json.loads(os.environ["GPUBOOK_FUZZ_CREDENTIALS"])
AS_GENERATED = 4  # one case in this many goes as generated
ZONES = sorted(zoneinfo.available_timezones())


def _digest(value: object) -> int:
    return int(hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest(), 16)


def _get(path: str, **params) -> list[dict]:
    response = requests.get(f"{API}{path}", params=params, headers=HEADERS, timeout=30)
    response.raise_for_status()
    return response.json()["results"]


def _offset_of(text: object) -> dt.tzinfo:
    """The generated time's offset, so the fuzzer's offsets still reach the server (UTC for one
    with seconds, which RFC 3339 cannot write)."""
    try:
        tz = dt.datetime.fromisoformat(text).tzinfo
    except (TypeError, ValueError):
        return dt.UTC
    return tz if tz is not None and tz.utcoffset(None).seconds % 60 == 0 else dt.UTC


def _window(team: dict, start: object, end: object, now: dt.datetime) -> dict | None:
    """A start and end under the team's rules: the generated start picks the slot, the generated
    end the length, written with the generated start's offset. None when the team can book
    nothing now."""
    slot = dt.timedelta(minutes=SLOT_MINUTES)
    # A slot's margin past the notice: the server checks a moment after this runs.
    earliest = timegrid.ceil_to_slot(now + dt.timedelta(minutes=team["min_notice_minutes"]),
                                     slot_minutes=SLOT_MINUTES) + slot
    starts = (now + dt.timedelta(days=team["max_days_ahead"]) - earliest) // slot + 1
    hours = team["max_booking_hours"]
    lengths = hours * 60 // SLOT_MINUTES if hours else dt.timedelta(days=1) // slot
    if starts < 1 or lengths < 1:
        return None  # the team can book nothing now
    first = earliest + slot * (_digest(start) % starts)
    tz = _offset_of(start)
    return {"start": first.astimezone(tz).isoformat(),
            "end": (first + slot * (1 + _digest(end) % lengths)).astimezone(tz).isoformat()}


def _bookable(now: dt.datetime) -> dict[int, dict]:
    """The teams a window can be found for now, by id (the fuzzer sets some teams' rules so
    that none can)."""
    return {team["id"]: team for team in _get("/teams/") if _window(team, None, None, now) is not None}


def _booking_fields(body: dict, now: dt.datetime) -> dict:
    teams = _bookable(now)
    if not teams:
        return {}
    team = teams.get(body.get("team")) or teams[sorted(teams)[_digest(body.get("team")) % len(teams)]]
    nodes: dict[int, list[int]] = {}
    for gpu in _get("/gpus/"):
        nodes.setdefault(gpu["node_id"], []).append(gpu["id"])
    gpus = body.get("gpus") or []
    if not (gpus and any(set(gpus) <= set(ids) for ids in nodes.values())):
        ids = sorted(nodes.values())[_digest(gpus) % len(nodes)]
        gpus = ids[: 1 + _digest(gpus) % len(ids)]
    return {"team": team["id"], "gpus": gpus, **_window(team, body.get("start"), body.get("end"), now)}


def _an_upcoming_booking(key: object, now: dt.datetime) -> tuple[dict, dict] | None:
    """A booking that has not begun, of a team that can book now, and its team; booked through
    the API when the fuzzer has cancelled or moved all of them."""
    teams = _bookable(now)
    rows = [row for row in _get("/reservations/", **{"from": now.isoformat()})
            if row["status"] in ("pending", "confirmed") and row["team"] in teams
            and dt.datetime.fromisoformat(row["start"]) > now]
    if rows:
        row = rows[_digest(key) % len(rows)]
        return row, teams[row["team"]]
    if not teams:
        return None
    response = requests.post(f"{API}/reservations/", json=_booking_fields({}, now), headers=HEADERS, timeout=30)
    return (response.json(), teams[response.json()["team"]]) if response.status_code == 201 else None


def _booking(case, now: dt.datetime) -> None:
    case.body = {**case.body, **_booking_fields(case.body, now)}


def _change(case, now: dt.datetime) -> None:
    found = _an_upcoming_booking(case.path_parameters, now)
    if found is not None:
        booking, team = found
        case.path_parameters = {**case.path_parameters, "id": booking["id"]}
        case.body = {**case.body, **_window(team, case.body.get("start"), case.body.get("end"), now)}


def _series(case, now: dt.datetime) -> None:
    rule, zone = case.body.get("rrule"), case.body.get("time_zone")
    frequency = ("DAILY", "WEEKLY")[_digest(rule) % 2]
    case.body = {**case.body, **_booking_fields(case.body, now), "rrule": f"FREQ={frequency};COUNT={1 + _digest(rule) % 3}"}
    if zone is not None and zone not in ZONES:
        case.body["time_zone"] = ZONES[_digest(zone) % len(ZONES)]


def _wait(case, now: dt.datetime) -> None:
    found = _an_upcoming_booking(case.body, now)
    if found is not None:
        taken = found[0]
        case.body = {**case.body, "team": taken["team"], "gpus": taken["gpus"], "start": taken["start"],
                     "end": taken["end"]}


def _team_change(case, now: dt.datetime) -> None:
    zone = case.body.get("time_zone")
    if zone is not None and zone not in ZONES:
        case.body = {**case.body, "time_zone": ZONES[_digest(zone) % len(ZONES)]}


def _log_in(case, now: dt.datetime) -> None:
    case.body = {**case.body, **CREDENTIALS}


MOVES = {
    "POST /api/v1/auth/token/": _log_in,
    "POST /api/v1/reservations/": _booking,
    "PATCH /api/v1/reservations/{id}/": _change,
    "POST /api/v1/series/": _series,
    "POST /api/v1/waitlist/": _wait,
    "PATCH /api/v1/teams/{id}/": _team_change,
}


@schemathesis.hook
def map_case(context, case):
    move = MOVES.get(case.operation.label)
    negative = case.meta is not None and case.meta.generation.mode is GenerationMode.NEGATIVE
    if move is None or negative or not isinstance(case.body, dict) or _digest(case.body) % AS_GENERATED == 0:
        return case
    move(case, dt.datetime.now(dt.UTC))
    return case
