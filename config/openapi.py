"""Making the OpenAPI schema as exact as the API, so a client generated from it works.

drf-spectacular infers most of the schema; what it cannot see is described here, in one place,
without touching the views: the aware date-time field, the hand-written APIViews' bodies, the
path ids' integer range, the list filters' enums and formats, the fields every response always
carries, and the one error shape (`{"code", "detail", …}`) of every 4xx (DESIGN.md "Errors").
The job spec's schema states what its validator checks against as it is when the schema is
served (the image catalog, the largest node's GPUs and, to a signed-in caller, their teams): the
one part of the schema that differs by caller and over time, like the request examples' times.
Extensions register on import; settings name `postprocess` as a hook, which imports this module."""

import copy
import datetime as dt

from django.conf import settings
from django.utils import timezone
from drf_spectacular.extensions import OpenApiSerializerFieldExtension, OpenApiViewExtension
from drf_spectacular.utils import extend_schema, extend_schema_view, inline_serializer
from rest_framework import serializers

MAX_ID = 2**63 - 1
DATE_TIME = {"type": "string", "format": "date-time"}


AWARE = "RFC 3339 / ISO-8601 date-time with a UTC offset, e.g. 2026-12-01T09:00:00+01:00; a time without an " \
        "offset is refused."


class AwareDateTimeFieldExtension(OpenApiSerializerFieldExtension):
    target_class = "reservations.serializers.AwareDateTimeField"

    def map_serializer_field(self, auto_schema, direction):
        return {**DATE_TIME, "description": AWARE}


class _TimeWindow(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()


AVAILABILITY = inline_serializer(
    "Availability",
    {
        "gpus": serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=MAX_ID)),
        "from": serializers.DateTimeField(),
        "to": serializers.DateTimeField(),
        "free": _TimeWindow(many=True),
    },
)


def _replace(target: type, **methods) -> type:
    """A subclass of a view with schema annotations on some methods; the view itself is untouched."""
    return extend_schema_view(**methods)(type(target.__name__, (target,), {"__module__": target.__module__}))


# The token endpoint (accounts/api.py) declares its own schema.


class NodeAvailabilitySchema(OpenApiViewExtension):
    target_class = "reservations.api.NodeAvailabilityView"

    def view_replacement(self):
        return _replace(self.target_class, get=extend_schema(responses={200: AVAILABILITY}))


class GpuViewSetSchema(OpenApiViewExtension):
    target_class = "reservations.api.GpuViewSet"

    def view_replacement(self):
        return _replace(self.target_class, availability=extend_schema(responses={200: AVAILABILITY}))


class RunViewSetSchema(OpenApiViewExtension):
    target_class = "training.api.RunViewSet"

    def view_replacement(self):
        return _replace(self.target_class, log=extend_schema(responses={200: inline_serializer("RunLog", {
            "run": serializers.IntegerField(min_value=1, max_value=MAX_ID),
            "log": serializers.CharField(allow_blank=True, help_text="The last 200 lines, as the process wrote them."),
        })}))


class ReservationViewSetSchema(OpenApiViewExtension):
    """A rejection needs a reason (reservations/approvals.py): required, not blank, at most
    REASON_MAX characters once its runs of white space are collapsed."""

    target_class = "reservations.api.ReservationViewSet"

    def view_replacement(self):
        from reservations.approvals import REASON_MAX

        reason = serializers.RegexField(r"\S", max_length=REASON_MAX, help_text="Why; the booker reads it.")
        return _replace(self.target_class, reject=extend_schema(request=inline_serializer("Rejection", {
            "reason": reason,
        })))


class TelemetrySamplesSchema(OpenApiViewExtension):
    """The node agent's post (gpus/telemetry/store.py parse_bucket says what a bucket holds)."""

    target_class = "gpus.api.TelemetrySamplesView"

    def view_replacement(self):
        from gpus.api import MAX_BUCKETS_PER_POST
        from gpus.telemetry.store import _INTEGER_FIELDS, _RATIO_FIELDS, BUCKET_FIELDS

        def number(name):
            if name in _INTEGER_FIELDS:
                top = 2**31 - 1 if name == "sample_count" else MAX_ID
                return serializers.IntegerField(min_value=0, max_value=top, required=False, allow_null=True)
            top = 1 if name in _RATIO_FIELDS else None
            return serializers.FloatField(min_value=0, max_value=top, required=False, allow_null=True)

        bucket = inline_serializer("TelemetryBucket", {
            "minute": serializers.DateTimeField(help_text="The start of the minute, with a UTC offset."),
            "index": serializers.IntegerField(min_value=0, help_text="The GPU's device index on the node."),
            "uuid": serializers.CharField(required=False, allow_blank=True, max_length=64),
            **{name: number(name) for name in BUCKET_FIELDS},
        })
        return _replace(self.target_class, post=extend_schema(
            request=inline_serializer("TelemetryPost", {
                "node": serializers.CharField(required=False, help_text="The token's node, if given."),
                "buckets": serializers.ListField(child=bucket, max_length=MAX_BUCKETS_PER_POST),
            }),
            responses={202: inline_serializer("TelemetryStored", {
                "stored": serializers.IntegerField(min_value=0),
                "unknown_gpus": serializers.ListField(child=serializers.CharField(),
                                                      help_text="UUIDs (or `index N`) of GPUs not registered."),
            })},
            auth=[{"nodeToken": []}],
        ))


class ModelVersionsSchema(OpenApiViewExtension):
    """Its GET lists one model's versions: named apart from the models list's `models_list`."""

    target_class = "training.registry_api.ModelVersionsView"

    def view_replacement(self):
        return _replace(self.target_class, get=extend_schema(operation_id="models_versions_list"))


class RunReportSchema(OpenApiViewExtension):
    target_class = "training.api.RunReportView"

    def view_replacement(self):
        from training.services import PROGRESS_EVENTS

        return _replace(self.target_class, post=extend_schema(
            request=inline_serializer("RunReport", {
                "event": serializers.ChoiceField(choices=sorted(PROGRESS_EVENTS)),
                "epoch": serializers.IntegerField(min_value=0, required=False, allow_null=True),
                "metrics": serializers.DictField(required=False),
                "detail": serializers.DictField(required=False),
            }),
            responses={202: inline_serializer("ReportAccepted", {"accepted": serializers.BooleanField()})},
            auth=[{"runToken": []}],
        ))


# --- the postprocessing hook -------------------------------------------------------------------

GPU_HOURS = {"type": "number", "format": "double", "minimum": 0}


def _error_schema() -> dict:
    """Every field an error may carry (config/errors.py and config/api_errors.py raise them), so
    a generated client keeps none of them as undeclared extras; other fields never appear."""
    from config.errors import ErrorCode

    return {
        "type": "object",
        "description": "Every API error: a machine code, a sentence for people, and details where they help.",
        "properties": {
            "code": {"type": "string", "enum": [code.value for code in ErrorCode], "example": "slot_conflict"},
            "detail": {"type": "string", "example": "The requested time collides with 1 existing booking(s): …"},
            "conflicts": {"type": "array", "description": "slot_conflict: the bookings in the way; other teams' "
                          "only as time and GPUs", "items": {
                "type": "object", "additionalProperties": False, "required": ["start", "end", "gpus"],
                "properties": {
                    "start": DATE_TIME, "end": DATE_TIME,
                    "gpus": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": MAX_ID}},
                    "reservation": {"type": "integer", "minimum": 1, "maximum": MAX_ID},
                    "team": {"type": "string"}, "user": {"type": "string"},
                },
            }},
            "problems": {"type": "array", "description": "invalid_spec: every problem of a job spec", "items": {
                "type": "object", "additionalProperties": False, "required": ["field", "problem"],
                "properties": {"field": {"type": "string"}, "problem": {"type": "string"}},
            }},
            "fields": {"type": "object", "description": "invalid: the messages by field, as a list of sentences or, "
                       "for a nested field, an object of the same shape", "additionalProperties": {}},
            "gpus": {"type": "array", "description": "unknown_gpu: the GPU ids that do not exist",
                     "items": {"type": "integer"}},
            "month": {"type": "string", "description": "quota_exceeded: the month (YYYY-MM) in the team's zone"},
            "day": {"type": "string", "format": "date", "description": "daily_cap_exceeded: the day"},
            "remaining_gpu_hours": GPU_HOURS, "requested_gpu_hours": GPU_HOURS, "backfill_gpu_hours": GPU_HOURS,
            "quota_gpu_hours": {"type": "integer", "minimum": 0},
            "retry_after_s": {"type": "integer", "minimum": 0, "description": "busy, rate_limited: when to retry"},
        },
        "required": ["code", "detail"],
        "additionalProperties": False,
    }


ERROR_DESCRIPTIONS = {
    "400": "Invalid input", "401": "Not authenticated", "403": "Not permitted", "404": "Not found",
    "409": "Conflict: the slot is taken, the quota is exhausted, or the state does not allow it",
    "429": "Rate limited",
}
WRITE_METHODS = {"post", "put", "patch", "delete"}
JOB_SUBMIT = {"$ref": "#/components/schemas/JobSubmitRequest"}
JOB_ADVICE = {"$ref": "#/components/schemas/JobAdviceRequest"}
JOB_SPEC = {"$ref": "#/components/schemas/JobSpecRequest"}
CHANGE = {"$ref": "#/components/schemas/PatchedReservationUpdateRequest"}


def _job_spec_schema(request) -> dict:
    """The spec validator's rules (training/jobspec.py json_schema) with what they check against
    as it is when the schema is served: the allowed images, the largest node's GPU count and, for
    a signed-in caller, the teams they may submit for (training/services.py job_submit). Written
    with no request (`manage.py spectacular`, the system check, maybe before `migrate`): the
    rules alone, without reading the database."""
    from reservations.selectors import teams_visible_to
    from training.jobspec import json_schema
    from training.services import allowed_images, largest_node_gpu_count

    images, max_gpus, teams = [], 0, None
    if request is not None:
        images, max_gpus = list(allowed_images()), largest_node_gpu_count()
        if request.user.is_authenticated:
            teams = list(teams_visible_to(user=request.user).values_list("slug", flat=True))
    schema = json_schema(images=images, max_gpus=max_gpus, data_roots=settings.GPUBOOK_DATA_ROOTS, teams=teams)
    return {**schema, "description": "A job spec (docs: training/jobspec.py), or a seed-style job file's fields. "
                                     "Served to a signed-in caller, `team` lists the teams they may submit for."}


def _query_enums() -> dict[tuple[str, str], list[str]]:
    from reservations.models import Reservation
    from training.models import TrainingJob

    return {
        ("/api/v1/reservations/", "status"): [value for value, _ in Reservation.Status.choices],
        ("/api/v1/jobs/", "state"): [value for value, _ in TrainingJob.State.choices],
    }


def postprocess(result, generator, request, public):
    """Add what inference cannot know; see the module docstring."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas["Error"] = _error_schema()
    result["components"].setdefault("securitySchemes", {})["runToken"] = {
        "type": "http", "scheme": "bearer", "description": "The per-run token the runner is given.",
    }
    result["components"]["securitySchemes"]["nodeToken"] = {
        "type": "http", "scheme": "bearer", "description": "A node agent's token (`gpu_agent --issue-token NODE`).",
    }
    enums = _query_enums()
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            for parameter in operation.get("parameters", []):
                _tighten_parameter(path, parameter, enums)
            # 401/403 on every operation: the open ones (token exchange, runner and node-agent
            # reports) still refuse a bad credential of their own.
            statuses = {"400", "401", "403", "404", "429"}
            if method in WRITE_METHODS:
                statuses.add("409")
            body = operation.get("requestBody", {})
            if body.get("content", {}).get("application/json", {}).get("schema") == CHANGE:
                body["required"] = True  # no body changes nothing: refused (nothing_to_change)
            if body.get("content", {}).get("application/json", {}).get("schema") == JOB_SUBMIT:
                body["required"] = True  # no body is neither `spec` nor `spec_yaml`: refused
                if path == "/api/v1/jobs/advice/":
                    for content in body["content"].values():
                        content["schema"] = JOB_ADVICE
            responses = operation.setdefault("responses", {})
            for status in sorted(statuses):
                responses.setdefault(status, {
                    "description": ERROR_DESCRIPTIONS[status],
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
                })
    _exact_request_bodies(schemas, request=request)
    _timing_rules(schemas)
    _request_examples(schemas, now=timezone.now())
    _exact_json_fields(schemas)
    for name, schema in schemas.items():
        if name == "Error" or "properties" not in schema:
            continue
        for field, field_schema in schema["properties"].items():
            _tighten_id(field, field_schema)
        # A response object always carries every field it declares; request shapes keep their own list.
        if not (name.endswith("Request") or name.startswith("Patched")):
            schema["required"] = sorted(schema["properties"])
    return result


def _exact_request_bodies(schemas: dict, *, request) -> None:
    """What the serializers check in code rather than per field."""
    job = schemas.get("JobSubmitRequest")
    if job:  # training/serializers.py JobSubmitSerializer.validate: one of the two, never both
        schemas["JobSpecRequest"] = _job_spec_schema(request)
        description = job["properties"]["spec"].get("description", "")
        job["properties"]["spec"] = {"allOf": [JOB_SPEC], "description": description}
        # Not `oneOf` at the top: client generators then give up on the body's type altogether.
        job["allOf"] = [{"anyOf": [{"required": ["spec"]}, {"required": ["spec_yaml"]}]}]
        job["not"] = {"required": ["spec", "spec_yaml"]}
        job["properties"]["spec_yaml"]["pattern"] = r"\S"  # DRF trims a text field: only white space is blank
        # Advice is for YOLO jobs only (training/advice.py): a command job's spec is refused there.
        schemas["JobAdviceRequest"] = {**copy.deepcopy(job), "description": "A YOLO job's spec, as for a submit."}
        schemas["JobAdviceRequest"]["properties"]["spec"]["allOf"].append({"required": ["yolo"]})
    change = schemas.get("PatchedReservationUpdateRequest")
    if change:  # a change that changes nothing is refused (nothing_to_change)
        change["minProperties"] = 1
    booking = schemas.get("ReservationCreateRequest")
    if booking:  # a booking of no GPUs is refused (no_gpus), as a series' or a wait's is
        booking["properties"]["gpus"]["minItems"] = 1
    series = schemas.get("SeriesCreateRequest")
    if series:  # reservations/recurring.py occurrences: an endless rule is refused
        series["properties"]["rrule"]["pattern"] = "[Uu][Nn][Tt][Ii][Ll]=|[Cc][Oo][Uu][Nn][Tt]="
    promote = schemas.get("PromoteRequest")
    if promote:  # training/registry.py NAME
        from training.registry import NAME

        promote["properties"]["name"]["pattern"] = NAME.pattern


def _timing_rules(schemas: dict) -> None:
    """What the services check on a body's times, in words: OpenAPI 3.0 can compare neither two
    fields nor a field with the clock (reservations/services.py _validate_times and
    _validate_team_rules, reservation_reschedule; recurring.py series_create; waitlist.py
    waitlist_join). tests/security/fuzz_hooks.py moves the fuzzer's times onto these rules."""
    grid = (f"on the {settings.GPUBOOK_SLOT_MINUTES}-minute slot grid in UTC (whatever offset they are written "
            "with), the end after the start; the start not in a slot that has begun, at least the team's "
            "`min_notice_minutes` ahead and at most its `max_days_ahead` days ahead; at most the team's "
            "`max_booking_hours` long (GET /api/v1/teams/{id}/ serves the team's rules).")
    rules = {
        "ReservationCreateRequest": f"Both {grid}",
        "PatchedReservationUpdateRequest": f"The new times, both {grid} A booking that has begun keeps its start "
                                           "and may not end before the current slot ends.",
        "SeriesCreateRequest": f"The first occurrence's. Each occurrence is booked like a single booking, both {grid} "
                               "A refused occurrence is reported in the series' `failed`; the series is still made.",
        "WaitlistJoinRequest": "A future slot (the start after now, the end after the start) that is taken now: a "
                               "free slot is refused (409 slot_free). The entry expires at the slot's start.",
    }
    for name, rule in rules.items():
        properties = schemas.get(name, {}).get("properties", {})
        for field in ("start", "end"):
            if field in properties:
                properties[field]["description"] = f"{AWARE} {rule}"


# Bodies whose validity depends on the clock (a future slot on the grid, start before end) and on
# what exists, which a schema cannot say: each such field carries an example, the times valid when
# the schema was served, so a client (and a schema-driven tester) has a request to start from.
TIMED_BODIES = ("ReservationCreateRequest", "SeriesCreateRequest", "WaitlistJoinRequest",
                "PatchedReservationUpdateRequest")


def _request_examples(schemas: dict, *, now) -> None:
    start = (now + dt.timedelta(days=2)).replace(hour=9, minute=0, second=0, microsecond=0)
    values = {"start": start.isoformat(), "end": (start + dt.timedelta(hours=1)).isoformat(),
              "gpus": [1], "team": 1, "rrule": "FREQ=DAILY;COUNT=2", "time_zone": "UTC"}
    for name in TIMED_BODIES:
        properties = schemas.get(name, {}).get("properties", {})
        for field, value in values.items():
            if field in properties:
                properties[field]["example"] = value
    for name in ("JobSubmitRequest", "JobAdviceRequest"):  # the second seed's own job file (issue 16)
        if name in schemas:
            schemas[name]["properties"]["spec_yaml"]["example"] = JOB_FILE_EXAMPLE
            # The body's too: its required field is one of two (an anyOf), so a tool building an
            # example from the required properties' finds none.
            schemas[name]["example"] = {"spec_yaml": JOB_FILE_EXAMPLE}


JOB_FILE_EXAMPLE = """\
task_name: pcb-defects
image: yolo:v8n-cu118
command: "yolo train data=pcb_defect.yaml model=yolov8s.pt epochs=100 imgsz=640"
user: vision
resources: {gpu: 1}
"""


HOURS = {"type": "number", "format": "double"}
# Model JSONFields and computed dicts, whose shape drf-spectacular cannot see.
JSON_FIELD_SHAPES = {
    "gpu_ids": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": MAX_ID},
                "description": "Database ids of the GPUs."},
    "gpu_indices": {"type": "array", "items": {"type": "integer", "minimum": 0},
                    "description": "Device indices on the node."},
    "usage": {"type": "object", "readOnly": True, "additionalProperties": False,
              "description": "This month's quota use (reservations.selectors.QuotaPosition.as_dict), in GPU-hours.",
              "required": ["month", "quota_gpu_hours", "booked_gpu_hours", "backfill_gpu_hours", "used_gpu_hours",
                           "remaining_gpu_hours"],
              "properties": {"month": {"type": "string", "description": "YYYY-MM in the team's zone"},
                             "quota_gpu_hours": HOURS, "booked_gpu_hours": HOURS, "backfill_gpu_hours": HOURS,
                             "used_gpu_hours": HOURS, "remaining_gpu_hours": HOURS}},
}


def _exact_json_fields(schemas: dict) -> None:
    for schema in schemas.values():
        for field, shape in JSON_FIELD_SHAPES.items():
            current = schema.get("properties", {}).get(field)
            if current is not None and current.get("type") in (None, "object") and "properties" not in current:
                schema["properties"][field] = {**shape, **({"readOnly": True} if current.get("readOnly") else {})}


ID_FIELDS = {"id", "gpu", "gpus", "team", "node", "job", "run", "reservation"}


def _tighten_id(field: str, schema: dict) -> None:
    """Database ids, in requests and responses alike, are 1 … 2**63-1; counts are never negative."""
    target = schema.get("items", {}) if schema.get("type") == "array" else schema
    if target.get("type") != "integer":
        return
    if field in ID_FIELDS or field.endswith("_id"):
        target.setdefault("minimum", 1)
        target.setdefault("maximum", MAX_ID)
    elif field == "count":
        target.setdefault("minimum", 0)


def _tighten_parameter(path: str, parameter: dict, enums: dict) -> None:
    schema = parameter.setdefault("schema", {})
    name = parameter.get("name")
    if parameter.get("in") == "path" and name in {"id", "pk"}:
        parameter["schema"] = {"type": "integer", "minimum": 1, "maximum": MAX_ID}
    elif parameter.get("in") == "query":
        if name in {"from", "to"}:
            parameter["schema"] = {**DATE_TIME}
        elif name in {"gpu", "team"} and schema.get("type") == "integer":
            schema.update(minimum=1, maximum=MAX_ID)
        elif (path, name) in enums:
            parameter["schema"] = {"type": "string", "enum": enums[(path, name)]}
