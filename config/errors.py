"""Errors raised by services, and every code an error may carry.

Each error carries a stable code (an `ErrorCode`), a sentence for people, the HTTP status an
API should answer with, and optional structured extras (conflicting bookings, quota left).
`ErrorCode` is the one list of codes: raise with its members, never a bare string, and a new
code gets a line in `ERROR_CODE_MEANINGS` (the API docs list them from there).
"""

from enum import StrEnum


class ErrorCode(StrEnum):
    # booking: input and rules (400)
    NO_GPUS = "no_gpus"
    UNKNOWN_GPU = "unknown_gpu"
    MULTIPLE_NODES = "multiple_nodes"
    GPU_UNAVAILABLE = "gpu_unavailable"
    NAIVE_DATETIME = "naive_datetime"
    INVALID_DATETIME = "invalid_datetime"
    INVALID_RANGE = "invalid_range"
    OFF_GRID = "off_grid"
    PAST_SLOT = "past_slot"
    TOO_SOON = "too_soon"
    TOO_FAR_AHEAD = "too_far_ahead"
    TOO_LONG = "too_long"
    MAINTENANCE = "maintenance"
    NOTHING_TO_CHANGE = "nothing_to_change"
    UNKNOWN_SETTING = "unknown_setting"
    UNKNOWN_TEAM = "unknown_team"
    UNKNOWN_TIME_ZONE = "unknown_time_zone"
    # booking: conflicts (409)
    SLOT_CONFLICT = "slot_conflict"
    NO_ROOM = "no_room"
    QUOTA_EXCEEDED = "quota_exceeded"
    DAILY_CAP_EXCEEDED = "daily_cap_exceeded"
    BUSY = "busy"
    ALREADY_STARTED = "already_started"
    NOT_CANCELLABLE = "not_cancellable"
    NOT_CHANGEABLE = "not_changeable"
    NOT_RELEASABLE = "not_releasable"
    NOT_PENDING = "not_pending"
    # approvals, recurring bookings, the waitlist
    REASON_REQUIRED = "reason_required"
    REASON_TOO_LONG = "reason_too_long"
    INVALID_RULE = "invalid_rule"
    ENDLESS_RULE = "endless_rule"
    EMPTY_RULE = "empty_rule"
    TOO_MANY_OCCURRENCES = "too_many_occurrences"
    INVALID_GPUS = "invalid_gpus"
    INVALID_MODE = "invalid_mode"
    SLOT_FREE = "slot_free"
    TOO_MANY_WAITING = "too_many_waiting"
    # training jobs and runs
    INVALID_SPEC = "invalid_spec"
    TOO_MANY_GPUS = "too_many_gpus"
    INVALID_REPORT = "invalid_report"
    INVALID_RUN_TOKEN = "invalid_run_token"  # noqa: S105 — a code, not a secret
    WRONG_TEAM = "wrong_team"
    RESERVATION_OVER = "reservation_over"
    ALREADY_FINISHED = "already_finished"
    NOT_WAITING = "not_waiting"
    RUN_ENDED = "run_ended"
    ENGINE_NEEDS_NVIDIA = "engine_needs_nvidia"
    COMMAND_JOBS_REFUSED = "command_jobs_refused"
    NO_ADVICE = "no_advice"
    NOT_A_TUNE = "not_a_tune"
    NO_TUNE_RESULT = "no_tune_result"
    # model registry
    INVALID_NAME = "invalid_name"
    INVALID_VERSION = "invalid_version"
    RUN_NOT_SUCCEEDED = "run_not_succeeded"
    NO_WEIGHTS = "no_weights"
    ALREADY_PROMOTED = "already_promoted"
    FILE_GONE = "file_gone"
    # telemetry
    INVALID_NODE_TOKEN = "invalid_node_token"  # noqa: S105 — a code, not a secret
    WRONG_NODE = "wrong_node"
    INVALID_GPU = "invalid_gpu"
    INVALID_SAMPLES = "invalid_samples"
    INVALID_TIME = "invalid_time"
    TOO_MANY_BUCKETS = "too_many_buckets"
    # notifications
    UNKNOWN_EVENT = "unknown_event"
    UNSAFE_WEBHOOK_URL = "unsafe_webhook_url"
    # who may do what
    NOT_TEAM_MEMBER = "not_team_member"
    NOT_PERMITTED = "not_permitted"
    NOT_FOUND = "not_found"
    # the API's own (config.api_errors)
    INVALID = "invalid"
    INVALID_PARAMETER = "invalid_parameter"
    INVALID_CREDENTIALS = "invalid_credentials"
    RANGE_TOO_LONG = "range_too_long"
    MALFORMED_REQUEST = "malformed_request"
    NOT_AUTHENTICATED = "not_authenticated"
    AUTHENTICATION_FAILED = "authentication_failed"
    PERMISSION_DENIED = "permission_denied"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    NOT_ACCEPTABLE = "not_acceptable"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    RATE_LIMITED = "rate_limited"
    ERROR = "error"


ERROR_CODE_MEANINGS: dict[ErrorCode, str] = {
    ErrorCode.NO_GPUS: "The booking names no GPU.",
    ErrorCode.UNKNOWN_GPU: "A GPU id does not exist (`gpus` lists them).",
    ErrorCode.MULTIPLE_NODES: "The GPUs of one booking must be on one node.",
    ErrorCode.GPU_UNAVAILABLE: "A GPU is drained or in maintenance.",
    ErrorCode.NAIVE_DATETIME: "A time has no UTC offset or zone.",
    ErrorCode.INVALID_DATETIME: "A time is not ISO 8601.",
    ErrorCode.INVALID_RANGE: "The end is not after the start (or the range is out of bounds).",
    ErrorCode.OFF_GRID: "Start and end must be on the slot grid.",
    ErrorCode.PAST_SLOT: "The slot has begun or passed.",
    ErrorCode.TOO_SOON: "The team needs more notice.",
    ErrorCode.TOO_FAR_AHEAD: "The start is past the team's booking horizon.",
    ErrorCode.TOO_LONG: "Longer than the team's longest booking.",
    ErrorCode.MAINTENANCE: "The node is in maintenance then.",
    ErrorCode.NOTHING_TO_CHANGE: "A change request changed nothing.",
    ErrorCode.UNKNOWN_SETTING: "Not a team setting.",
    ErrorCode.UNKNOWN_TEAM: "No such team (or not yours).",
    ErrorCode.UNKNOWN_TIME_ZONE: "Not an IANA time zone.",
    ErrorCode.SLOT_CONFLICT: "The time collides with bookings (listed in `conflicts`).",
    ErrorCode.NO_ROOM: "No node has that many GPUs free for the whole slot.",
    ErrorCode.QUOTA_EXCEEDED: "The team's month would pass its quota (bookings + backfill); says what is left.",
    ErrorCode.DAILY_CAP_EXCEEDED: "Your daily GPU-hours in the team would pass the cap.",
    ErrorCode.BUSY: "Another booking holds the lock or won a race: try again.",
    ErrorCode.ALREADY_STARTED: "The booking has begun: release it instead, or keep its start.",
    ErrorCode.NOT_CANCELLABLE: "Only pending or confirmed bookings can be cancelled.",
    ErrorCode.NOT_CHANGEABLE: "Only upcoming or active bookings can be changed.",
    ErrorCode.NOT_RELEASABLE: "Only upcoming or active bookings can be released.",
    ErrorCode.NOT_PENDING: "The booking is not waiting for approval.",
    ErrorCode.REASON_REQUIRED: "A rejection needs a reason for the booker.",
    ErrorCode.REASON_TOO_LONG: "The rejection reason is too long.",
    ErrorCode.INVALID_RULE: "Not a valid RFC 5545 RRULE.",
    ErrorCode.ENDLESS_RULE: "A recurrence rule needs UNTIL or COUNT.",
    ErrorCode.EMPTY_RULE: "The recurrence rule gives no date at or after the first start.",
    ErrorCode.TOO_MANY_OCCURRENCES: "A series has too many occurrences.",
    ErrorCode.INVALID_GPUS: "The GPUs do not exist or are not on one node.",
    ErrorCode.INVALID_MODE: "Not a waitlist mode (notify or book).",
    ErrorCode.SLOT_FREE: "The slot is free: book it instead of waiting.",
    ErrorCode.TOO_MANY_WAITING: "You wait for too many slots already.",
    ErrorCode.INVALID_SPEC: "The job spec is invalid (the detail says where).",
    ErrorCode.TOO_MANY_GPUS: "The job wants more GPUs than its booking or any node has.",
    ErrorCode.INVALID_REPORT: "A runner's progress report is malformed.",
    ErrorCode.INVALID_RUN_TOKEN: "The runner's token is wrong for this run.",
    ErrorCode.WRONG_TEAM: "The booking belongs to another team than the job.",
    ErrorCode.RESERVATION_OVER: "The booking has ended.",
    ErrorCode.ALREADY_FINISHED: "The job has already finished.",
    ErrorCode.NOT_WAITING: "The job is not waiting.",
    ErrorCode.RUN_ENDED: "The run has ended; its report token no longer writes.",
    ErrorCode.ENGINE_NEEDS_NVIDIA: "The requested export format needs an NVIDIA GPU the job does not get.",
    ErrorCode.COMMAND_JOBS_REFUSED: "Command jobs need GPUBOOK_JOB_USER (or GPUBOOK_SINGLE_USER) on a local executor.",
    ErrorCode.NO_ADVICE: "Batch advice is only for YOLO jobs with an allowed image.",
    ErrorCode.NOT_A_TUNE: "The job is not a hyper-parameter tune (it has no `tune:`).",
    ErrorCode.NO_TUNE_RESULT: "The tune has not finished an iteration yet.",
    ErrorCode.INVALID_NAME: "A model name is lower-case letters, digits and dashes.",
    ErrorCode.INVALID_VERSION: "A model version is malformed.",
    ErrorCode.RUN_NOT_SUCCEEDED: "Only a run that succeeded can be promoted to a model version.",
    ErrorCode.NO_WEIGHTS: "The run has no weights artifact to promote.",
    ErrorCode.ALREADY_PROMOTED: "The run is already a version of that model.",
    ErrorCode.FILE_GONE: "The model file is not on disk any more.",
    ErrorCode.INVALID_NODE_TOKEN: "The node agent's token is missing or wrong.",
    ErrorCode.WRONG_NODE: "The token belongs to another node.",
    ErrorCode.INVALID_GPU: "A telemetry sample names an unknown GPU.",
    ErrorCode.INVALID_SAMPLES: "Telemetry samples are malformed.",
    ErrorCode.INVALID_TIME: "A telemetry time is malformed.",
    ErrorCode.TOO_MANY_BUCKETS: "Too many telemetry buckets in one request.",
    ErrorCode.UNKNOWN_EVENT: "Not a notification event type.",
    ErrorCode.UNSAFE_WEBHOOK_URL: "The webhook URL points at a private or local address.",
    ErrorCode.NOT_TEAM_MEMBER: "You are not a member of that team.",
    ErrorCode.NOT_PERMITTED: "Only the owner, a team manager or an admin may do this.",
    ErrorCode.NOT_FOUND: "No such object (or not visible to you).",
    ErrorCode.INVALID: "Input failed validation (`fields` says where).",
    ErrorCode.INVALID_PARAMETER: "A query parameter is malformed.",
    ErrorCode.INVALID_CREDENTIALS: "Wrong username or password.",
    ErrorCode.RANGE_TOO_LONG: "The requested time range is too long.",
    ErrorCode.MALFORMED_REQUEST: "The body is not valid JSON.",
    ErrorCode.NOT_AUTHENTICATED: "No credentials were sent.",
    ErrorCode.AUTHENTICATION_FAILED: "The credentials are wrong.",
    ErrorCode.PERMISSION_DENIED: "Authenticated, but not allowed.",
    ErrorCode.METHOD_NOT_ALLOWED: "The path does not take this method.",
    ErrorCode.NOT_ACCEPTABLE: "Cannot answer in the requested format.",
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: "The body's content type is not accepted.",
    ErrorCode.RATE_LIMITED: "Too many requests; `retry_after_s` says when to retry.",
    ErrorCode.ERROR: "Any other API error.",
}


def error_codes_markdown() -> str:
    """The list of codes for the API docs' description."""
    return "\n".join(f"- `{code}`: {ERROR_CODE_MEANINGS[code]}" for code in ErrorCode)


class DomainError(Exception):
    http_status = 400

    def __init__(self, code: ErrorCode, detail: str, **extra: object) -> None:
        super().__init__(detail)
        self.code = ErrorCode(code)  # refuses a code that is not listed above
        self.detail = detail
        self.extra = extra


class Conflict(DomainError):
    http_status = 409


class NotPermitted(DomainError):
    http_status = 403


class NotFound(DomainError):
    http_status = 404
