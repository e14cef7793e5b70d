"""gpubook settings. Every value comes from the environment through typed helpers (config.env).

The embedded default (no variables set) is a SQLite file, the in-process scheduler loop and the
local executor: what `make run` uses on a workstation. Production sets DATABASE_URL, REDIS_URL,
SECRET_KEY, DEBUG=false, ALLOWED_HOSTS and EXECUTOR=kubernetes.
"""

from pathlib import Path

from config.env import (
    ConfigError,
    database_from_url,
    env_bool,
    env_choice,
    env_float,
    env_header_pair,
    env_int,
    env_list,
    env_str,
)
from config.errors import error_codes_markdown
from scheduler.queue_estimates import PLAN_BUDGET as _QUEUE_ESTIMATE_BUDGET

BASE_DIR = Path(__file__).resolve().parent.parent
# Where the embedded default keeps its SQLite file, run outputs and logs.
VAR_DIR = Path(env_str("GPUBOOK_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env_bool("DEBUG", False)
_DEV_SECRET = "gpubook-insecure-development-key-do-not-use-in-production"  # noqa: S105 — DEBUG only
SECRET_KEY = env_str("SECRET_KEY", _DEV_SECRET if DEBUG else "")
if not SECRET_KEY:
    raise ConfigError("SECRET_KEY must be set when DEBUG is false")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "django_htmx",
    "gpus",
    "reservations",
    "training",
    "notifications",
    "reports",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "reservations.middleware.ViewerZoneMiddleware",  # request.viewer_zone, active for every page
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": database_from_url(
        env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'gpubook.sqlite3'}"), base_dir=str(BASE_DIR)
    )
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/calendar/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"

SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "config.api_errors.exception_handler",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 200,
    "DEFAULT_THROTTLE_CLASSES": ["rest_framework.throttling.UserRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"user": env_str("API_RATE_LIMIT", "100000/hour"), "auth": "30/minute"},
}
SPECTACULAR_SETTINGS = {
    "TITLE": "gpubook API",
    # Every error code, from the one list in config/errors.py (pure Python, safe to import here).
    "DESCRIPTION": "GPU time-slot reservations and YOLO training jobs.\n\n"
    'Every error answers `{"code": …, "detail": …}`. The codes:\n\n' + error_codes_markdown(),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
}

CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# --- gpubook ------------------------------------------------------------------------------
GPUBOOK_SLOT_MINUTES = env_int("GPUBOOK_SLOT_MINUTES", 30, minimum=1)
# Longest wait for a booking lock (PostgreSQL lock_timeout) before answering "busy, try again".
GPUBOOK_BOOKING_LOCK_TIMEOUT_MS = env_int("GPUBOOK_BOOKING_LOCK_TIMEOUT_MS", 3000, minimum=1)
# Usage factor for queued (backfill) runs against the monthly quota: idle time is cheaper.
GPUBOOK_BACKFILL_USAGE_FACTOR = env_float("GPUBOOK_BACKFILL_USAGE_FACTOR", 0.5)
GPUBOOK_STOP_GRACE_SECONDS = env_int("GPUBOOK_STOP_GRACE_SECONDS", 60, minimum=0)
GPUBOOK_NO_SHOW_MINUTES = env_int("GPUBOOK_NO_SHOW_MINUTES", 15, minimum=1)
# Queue relief (scheduler.queue_relief): after this many minutes of waiting with no room, four
# or more queued jobs may have a checkpointable backfill run stopped for them; 0 = off.
GPUBOOK_QUEUE_RELIEF_MINUTES = env_int("GPUBOOK_QUEUE_RELIEF_MINUTES", 60, minimum=0)
# Queue drain (scheduler.queue_drain): after this many minutes of waiting, the oldest job that
# needs a whole node has the fewest checkpointable backfill runs on one node stopped for it; 0 = off.
GPUBOOK_QUEUE_DRAIN_MINUTES = env_int("GPUBOOK_QUEUE_DRAIN_MINUTES", 60, minimum=0)
# Stops that relief and the drain may make in a week: 1 % of the jobs queued that week plus this
# many. The drain acts only while more than four are left, so at 2 it needs 300 queued jobs a
# week; a small cluster that wants whole-node jobs drained for raises it (6: two drain stops).
GPUBOOK_QUEUE_STOP_ALLOWANCE = env_int("GPUBOOK_QUEUE_STOP_ALLOWANCE", 2, minimum=0)
GPUBOOK_EXECUTOR = env_choice("EXECUTOR", "local", {"local", "kubernetes"})
GPUBOOK_TICK_SECONDS = env_int("GPUBOOK_TICK_SECONDS", 5, minimum=1)
# Directories a team's jobs may read data and weights from; "{team}" is the team's slug.
GPUBOOK_DATA_ROOTS = env_list(
    "GPUBOOK_DATA_ROOTS", [str(VAR_DIR / "datasets" / "{team}"), str(VAR_DIR / "datasets" / "shared")]
)
# Where runs write checkpoints, logs and artifacts (a shared volume in production).
GPUBOOK_RUNS_DIR = Path(env_str("GPUBOOK_RUNS_DIR", str(VAR_DIR / "runs")))
# Registry prefix for catalog images, e.g. "registry.example.com/gpubook/".
GPUBOOK_IMAGE_REGISTRY = env_str("GPUBOOK_IMAGE_REGISTRY", "")
# How the local executor runs the trainer: its Python (a venv with requirements-training.txt),
# the device ("cpu" on a machine without CUDA), and DataLoader workers.
GPUBOOK_RUNNER_PYTHON = env_str("GPUBOOK_RUNNER_PYTHON", "")
GPUBOOK_RUNNER_DEVICE = env_choice("GPUBOOK_RUNNER_DEVICE", "cpu", {"cpu", "cuda"})
GPUBOOK_RUNNER_WORKERS = env_int("GPUBOOK_RUNNER_WORKERS", 1, minimum=0)
# Kubernetes executor: namespace per team ("{team}" is the slug) and the PVCs it mounts.
GPUBOOK_K8S_NAMESPACE_TEMPLATE = env_str("GPUBOOK_K8S_NAMESPACE_TEMPLATE", "gpubook-{team}")
GPUBOOK_K8S_DATA_PVC = env_str("GPUBOOK_K8S_DATA_PVC", "gpubook-data")
GPUBOOK_K8S_RUNS_PVC = env_str("GPUBOOK_K8S_RUNS_PVC", "gpubook-runs")
# Kubernetes pods, per team (training/executors/kubernetes.py): memory request = limit when a
# job names none, the /tmp emptyDir's size limit, imagePullSecrets ("*=regcred;vision=a,b":
# Secrets in the team's namespace, "*" for every team), and how long a pod may sit in an image
# pull error, a config error or Unschedulable before its run fails and its slot is freed.
GPUBOOK_K8S_DEFAULT_MEMORY = env_str("GPUBOOK_K8S_DEFAULT_MEMORY", "32Gi")
GPUBOOK_K8S_TMP_SIZE_LIMIT = env_str("GPUBOOK_K8S_TMP_SIZE_LIMIT", "8Gi")
GPUBOOK_K8S_IMAGE_PULL_SECRETS = env_str("GPUBOOK_K8S_IMAGE_PULL_SECRETS", "")
GPUBOOK_K8S_STUCK_PATIENCE_SECONDS = env_int("GPUBOOK_K8S_STUCK_PATIENCE_SECONDS", 180, minimum=0)
# The URL runners use to reach this app's run-report endpoint.
GPUBOOK_BASE_URL = env_str("GPUBOOK_BASE_URL", "http://127.0.0.1:8000")

# Telemetry and monitoring (gpus/telemetry, gpus/metrics.py, training/watchdog.py).
GPUBOOK_METRICS_TOKEN = env_str("GPUBOOK_METRICS_TOKEN", "")  # Bearer token for /metrics
# Without a token, /metrics answers only these networks (checked against REMOTE_ADDR).
# None by default: behind a proxy on the same host every request comes from 127.0.0.1.
GPUBOOK_METRICS_ALLOWED_NETWORKS = env_list("GPUBOOK_METRICS_ALLOWED_NETWORKS", [])
GPUBOOK_TELEMETRY_RETENTION_DAYS = env_int("GPUBOOK_TELEMETRY_RETENTION_DAYS", 30, minimum=1)
# The embedded loop samples this host's GPUs; set false where a gpu_agent or Prometheus does it.
GPUBOOK_TELEMETRY_LOCAL = env_bool("GPUBOOK_TELEMETRY_LOCAL", True)
GPUBOOK_NODE_NAME = env_str("GPUBOOK_NODE_NAME", "")  # this host's node name; "" = host name
PROMETHEUS_URL = env_str("PROMETHEUS_URL", "")  # read DCGM figures from Prometheus instead of agents
GPUBOOK_PROMETHEUS_NODE_LABEL = env_str("GPUBOOK_PROMETHEUS_NODE_LABEL", "Hostname")
GPUBOOK_IDLE_DETECTION = env_bool("GPUBOOK_IDLE_DETECTION", True)
GPUBOOK_ANOMALY_STOP = env_bool("GPUBOOK_ANOMALY_STOP", True)
GPUBOOK_ANOMALY_TEMPERATURE_CELSIUS = env_float("GPUBOOK_ANOMALY_TEMPERATURE_CELSIUS", 90.0)
GPUBOOK_ANOMALY_LOSS_JUMP_FACTOR = env_float("GPUBOOK_ANOMALY_LOSS_JUMP_FACTOR", 3.0)
GPUBOOK_ANOMALY_LOSS_WINDOW = env_int("GPUBOOK_ANOMALY_LOSS_WINDOW", 5, minimum=3)

EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "gpubook@localhost")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10, minimum=1)

# Notifications (notifications/): the outbox is drained by the loop and by Celery.
GPUBOOK_REMINDER_MINUTES = env_int("GPUBOOK_REMINDER_MINUTES", 15, minimum=0)  # 0: no reminders
GPUBOOK_QUEUE_WAIT_NOTICE_MINUTES = env_int("GPUBOOK_QUEUE_WAIT_NOTICE_MINUTES", 60, minimum=1)
# Queued jobs' position and estimated start (training/queue.py) are re-planned at most this often:
# rolling plan() forward costs more than a tick, and an estimate minutes old is still useful.
GPUBOOK_QUEUE_ESTIMATE_SECONDS = env_int("GPUBOOK_QUEUE_ESTIMATE_SECONDS", 30, minimum=0)
# How far one estimate may roll plan() forward (scheduler.estimate_starts' budget, in plans counted by
# the queued jobs each orders: about 2 s at 1,024 GPUs and 5,000 queued); jobs it does not reach are
# shown "not before" the time it reached.
GPUBOOK_QUEUE_ESTIMATE_BUDGET = env_int("GPUBOOK_QUEUE_ESTIMATE_BUDGET", _QUEUE_ESTIMATE_BUDGET, minimum=1)
GPUBOOK_WEBHOOK_TIMEOUT_SECONDS = env_int("GPUBOOK_WEBHOOK_TIMEOUT_SECONDS", 10, minimum=1)
# Webhook targets in private, loopback or link-local ranges are refused unless listed here.
GPUBOOK_WEBHOOK_ALLOWED_NETWORKS = env_list("GPUBOOK_WEBHOOK_ALLOWED_NETWORKS", [])
GPUBOOK_NOTIFY_MAX_ATTEMPTS = env_int("GPUBOOK_NOTIFY_MAX_ATTEMPTS", 8, minimum=1)
GPUBOOK_NOTIFY_RETRY_BASE_SECONDS = env_int("GPUBOOK_NOTIFY_RETRY_BASE_SECONDS", 30, minimum=1)
GPUBOOK_NOTIFY_RETRY_MAX_SECONDS = env_int("GPUBOOK_NOTIFY_RETRY_MAX_SECONDS", 3600, minimum=1)
GPUBOOK_NOTIFY_CLAIM_SECONDS = env_int("GPUBOOK_NOTIFY_CLAIM_SECONDS", 120, minimum=1)
GPUBOOK_NOTIFY_BATCH_SECONDS = env_int("GPUBOOK_NOTIFY_BATCH_SECONDS", 30, minimum=1)

REDIS_URL = env_str("REDIS_URL", "")
# Hand new deliveries to Celery on commit (default: when there is a broker); the loop drains the rest.
GPUBOOK_NOTIFY_ENQUEUE = env_bool("GPUBOOK_NOTIFY_ENQUEUE", bool(REDIS_URL))
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = False
CELERY_TIMEZONE = "UTC"
CELERY_TASK_ACKS_LATE = True  # a worker that dies mid-tick leaves the task for another
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Beat ticks reconcile every few seconds; each tick also books an ETA task at the plan's next
# wake-up (a slot edge, a stop or kill due), so starts are not a tick late.
CELERY_BEAT_SCHEDULE = {
    "reconcile": {"task": "training.tasks.reconcile_tick", "schedule": float(GPUBOOK_TICK_SECONDS)},
    "telemetry": {"task": "gpus.telemetry.tick", "schedule": 60.0},
    "notifications": {"task": "notifications.run_once", "schedule": 10.0},
    "run-logs": {"task": "training.tasks.collect_run_logs", "schedule": 60.0},  # issue #17
}
CELERY_IMPORTS = ["gpus.telemetry.tasks"]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"redact_secrets": {"()": "config.security_headers.RedactSecretsFilter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "filters": ["redact_secrets"]}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    # A refused booking (409) is business as usual, not a warning; 5xx are still logged.
    "loggers": {
        "django.request": {"level": "ERROR"},
        # Access logs through the redacting handler: iCal feed tokens never reach a log line.
        "gunicorn.access": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "django.server": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}

# --- run logs and their archive (issue #17, training/logs.py) ----------------------------------
# Log lines, GPU telemetry and notices older than this many days move into gzip archives on
# the archive storage (`manage.py archive_logs`); 0 keeps everything in the database.
GPUBOOK_LOG_RETENTION_DAYS = env_int("GPUBOOK_LOG_RETENTION_DAYS", 90, minimum=0)
# A Django storage class for full logs and archives (e.g. storages.backends.s3.S3Storage from
# django-storages, configured by its own AWS_* settings); empty: files under GPUBOOK_ARCHIVE_DIR.
GPUBOOK_ARCHIVE_STORAGE = env_str("GPUBOOK_ARCHIVE_STORAGE", "")
GPUBOOK_ARCHIVE_DIR = Path(env_str("GPUBOOK_ARCHIVE_DIR", str(VAR_DIR / "archive")))

# --- production path (deploy/, README "Running it for real") --------------------------------
# Static files are served by the app itself (WhiteNoise), so the calendar works under gunicorn
# with DEBUG=false behind any proxy. Hashed, pre-compressed files from `collectstatic` (run at
# image build) get a far-future immutable Cache-Control; the manifest storage needs that
# collectstatic, so GPUBOOK_STATIC_MANIFEST=false serves plain names (tests, make run).
GPUBOOK_STATIC_MANIFEST = env_bool("GPUBOOK_STATIC_MANIFEST", not DEBUG)
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(STATIC_ROOT)))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise warns about a missing one
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if GPUBOOK_STATIC_MANIFEST
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
WHITENOISE_MAX_AGE = env_int("WHITENOISE_MAX_AGE", 0 if DEBUG else 3600, minimum=0)  # unhashed names only
# Outermost: GZip (the events feed is ~0.5 MiB of JSON for a busy week; Django pads
# compressed bodies against BREACH). Then ConditionalGet: an ETag on every full response and a
# 304 for a repeated request. WhiteNoise sits right after SecurityMiddleware, as it asks.
MIDDLEWARE = [
    "django.middleware.gzip.GZipMiddleware",
    "django.middleware.http.ConditionalGetMiddleware",
    MIDDLEWARE[0],
    "whitenoise.middleware.WhiteNoiseMiddleware",
    *MIDDLEWARE[1:],
]
assert MIDDLEWARE[2] == "django.middleware.security.SecurityMiddleware"

# HTTPS, all off unless set: the documented production environment (README, deploy/) sets them.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
# Behind a TLS-terminating proxy: "X-Forwarded-Proto: https" (only if the proxy always sets it).
SECURE_PROXY_SSL_HEADER = env_header_pair("SECURE_PROXY_SSL_HEADER")
# Plain HTTP stays allowed inside the cluster/compose network for the health probe and for
# training runs reporting to GPUBOOK_BASE_URL (token-authenticated, never a browser).
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^api/v1/runs/\d+/report/$"]
# Django wants at least 50 characters with 5 distinct ones (check --deploy, W009). The app
# image sets 50; scripts and tests that run with DEBUG=false and a short key leave it at 0.
SECRET_KEY_MIN_LENGTH = env_int("SECRET_KEY_MIN_LENGTH", 0, minimum=0)
if not DEBUG and len(SECRET_KEY) < SECRET_KEY_MIN_LENGTH:
    raise ConfigError(f"SECRET_KEY has {len(SECRET_KEY)} characters; at least {SECRET_KEY_MIN_LENGTH} are required")
# --- security and input hardening (docs/security.md) --------------------------------------
GPUBOOK_MAX_JSON_DEPTH = env_int("GPUBOOK_MAX_JSON_DEPTH", 32, minimum=2)
REST_FRAMEWORK["DEFAULT_PARSER_CLASSES"] = [
    "config.parsers.BoundedJSONParser",
    "rest_framework.parsers.FormParser",
    "rest_framework.parsers.MultiPartParser",
]
MIDDLEWARE.insert(1, "config.security_headers.ContentSecurityPolicyMiddleware")
GPUBOOK_CSP_REPORT_URI = env_str("GPUBOOK_CSP_REPORT_URI", "")  # optional violation reports
# Swagger UI from the vendored sidecar, its script served separately (no inline script).
INSTALLED_APPS.append("drf_spectacular_sidecar")
SPECTACULAR_SETTINGS.update({"SWAGGER_UI_DIST": "SIDECAR", "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
                             "REDOC_DIST": "SIDECAR"})
MIDDLEWARE.insert(2, "config.input_guards.RejectNulMiddleware")
REST_FRAMEWORK["DEFAULT_PAGINATION_CLASS"] = "config.input_guards.BoundedLimitOffsetPagination"

# Log-in guessing (config/login_guard.py): failures per address and per username in a window.
GPUBOOK_NUM_PROXIES = env_int("GPUBOOK_NUM_PROXIES", 0, minimum=0)  # trusted proxies in front
REST_FRAMEWORK["NUM_PROXIES"] = GPUBOOK_NUM_PROXIES  # DRF's throttles read the same address
GPUBOOK_LOGIN_MAX_FAILURES_PER_USERNAME = env_int("GPUBOOK_LOGIN_MAX_FAILURES_PER_USERNAME", 10, minimum=1)
GPUBOOK_LOGIN_MAX_FAILURES_PER_ADDRESS = env_int("GPUBOOK_LOGIN_MAX_FAILURES_PER_ADDRESS", 50, minimum=1)
GPUBOOK_LOGIN_LOCKOUT_SECONDS = env_int("GPUBOOK_LOGIN_LOCKOUT_SECONDS", 900, minimum=1)
if REDIS_URL:  # one cache for every worker: throttle and lockout counts are shared
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL,
                          "KEY_PREFIX": "gpubook"}}
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# API tokens of our own (accounts/): stored hashed, listed and revoked by their owner, dead
# after GPUBOOK_API_TOKEN_DAYS (0: never) and on a password change.
INSTALLED_APPS.append("accounts")
GPUBOOK_API_TOKEN_DAYS = env_int("GPUBOOK_API_TOKEN_DAYS", 90, minimum=0)
REST_FRAMEWORK["DEFAULT_AUTHENTICATION_CLASSES"] = [
    "accounts.authentication.ApiTokenAuthentication",
    "rest_framework.authentication.SessionAuthentication",
]

# --- API docs and schema (issue 16): config/openapi.py makes the schema exact. ----------------
SPECTACULAR_SETTINGS.update({
    "COMPONENT_SPLIT_REQUEST": True,  # request and response shapes differ (read-only, required fields)
    # Tags and operation ids from the resource ("reservations_create", not "v1_reservations_create"):
    # a generated client groups its calls by them.
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    # Request bodies are described as JSON only. The API also takes form posts (curl -d), but a
    # body declared under three media types makes generated clients send all three at once.
    "PARSER_WHITELIST": ["config.parsers.BoundedJSONParser"],
    "ENUM_NAME_OVERRIDES": {
        "ReservationStatusEnum": "reservations.models.Reservation.Status",
        "JobStateEnum": "training.models.TrainingJob.State",
        "RunStateEnum": "training.models.Run.State",
        "EventTypeEnum": "notifications.models.EventType",
    },
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "config.openapi.postprocess"],
})

# --- recurring bookings and the waitlist (issue 16) -------------------------------------------
# The waitlist sweep offers freed slots, oldest entry first; entries expire at the slot's start.
CELERY_BEAT_SCHEDULE["waitlist"] = {"task": "reservations.waitlist_run_once", "schedule": 30.0}
CELERY_IMPORTS = [*CELERY_IMPORTS, "reservations.tasks"]
# Local jobs cannot read the server (training/executors/local.py, README "Job isolation"):
# jobs run as this unprivileged OS user; without one, command jobs are refused unless the
# workstation declares a single trusted user.
GPUBOOK_JOB_USER = env_str("GPUBOOK_JOB_USER", "")
GPUBOOK_SINGLE_USER = env_bool("GPUBOOK_SINGLE_USER", False)

# --- single sign-on with OpenID Connect (issue 16; accounts/oidc.py, README "Single sign-on") ---
# Off until GPUBOOK_OIDC_CLIENT_ID is set, with either GPUBOOK_OIDC_ISSUER (endpoints from its
# discovery document) or all four endpoints. Secrets come only from the environment. Local
# accounts keep working either way (ModelBackend stays first).
GPUBOOK_OIDC_ISSUER = env_str("GPUBOOK_OIDC_ISSUER", "").rstrip("/")
OIDC_RP_CLIENT_ID = env_str("GPUBOOK_OIDC_CLIENT_ID", "")
OIDC_RP_CLIENT_SECRET = env_str("GPUBOOK_OIDC_CLIENT_SECRET", "")
OIDC_OP_AUTHORIZATION_ENDPOINT = env_str("GPUBOOK_OIDC_AUTHORIZATION_ENDPOINT", "")
OIDC_OP_TOKEN_ENDPOINT = env_str("GPUBOOK_OIDC_TOKEN_ENDPOINT", "")
OIDC_OP_USER_ENDPOINT = env_str("GPUBOOK_OIDC_USERINFO_ENDPOINT", "")
OIDC_OP_JWKS_ENDPOINT = env_str("GPUBOOK_OIDC_JWKS_ENDPOINT", "")
if OIDC_RP_CLIENT_ID:
    _needed = {"GPUBOOK_OIDC_CLIENT_SECRET": OIDC_RP_CLIENT_SECRET}
    if not GPUBOOK_OIDC_ISSUER:  # without discovery every endpoint must be named
        _needed.update({"GPUBOOK_OIDC_AUTHORIZATION_ENDPOINT": OIDC_OP_AUTHORIZATION_ENDPOINT,
                        "GPUBOOK_OIDC_TOKEN_ENDPOINT": OIDC_OP_TOKEN_ENDPOINT,
                        "GPUBOOK_OIDC_USERINFO_ENDPOINT": OIDC_OP_USER_ENDPOINT,
                        "GPUBOOK_OIDC_JWKS_ENDPOINT": OIDC_OP_JWKS_ENDPOINT})
    _missing = [name for name, value in _needed.items() if not value]
    if _missing:
        raise ConfigError(f"GPUBOOK_OIDC_CLIENT_ID is set but {', '.join(_missing)} is not"
                          " (the endpoints can come from GPUBOOK_OIDC_ISSUER)")
OIDC_RP_SIGN_ALGO = env_choice("GPUBOOK_OIDC_SIGN_ALGO", "RS256", {"RS256", "RS384", "RS512", "ES256", "ES384",
                                                                    "ES512", "PS256", "HS256"})
OIDC_RP_SCOPES = env_str("GPUBOOK_OIDC_SCOPES", "openid email profile groups")
OIDC_USE_PKCE = True
OIDC_TIMEOUT = env_int("GPUBOOK_OIDC_TIMEOUT_SECONDS", 10, minimum=1)
OIDC_CREATE_USER = env_bool("GPUBOOK_OIDC_CREATE_USERS", True)
OIDC_AUTHENTICATION_CALLBACK_URL = "oidc_authentication_callback"
LOGIN_REDIRECT_URL_FAILURE = LOGIN_URL
# The login page's button says "Sign in with <this>".
GPUBOOK_OIDC_PROVIDER_NAME = env_str("GPUBOOK_OIDC_PROVIDER_NAME", "single sign-on")
# Teams from the groups claim (a dotted path reads a nested claim, e.g. realm_access.roles):
# "<prefix><team-slug>" → member, "<prefix><team-slug><manager suffix>" → manager.
GPUBOOK_OIDC_GROUPS_CLAIM = env_str("GPUBOOK_OIDC_GROUPS_CLAIM", "groups")
GPUBOOK_OIDC_TEAM_PREFIX = env_str("GPUBOOK_OIDC_TEAM_PREFIX", "")
GPUBOOK_OIDC_MANAGER_SUFFIX = env_str("GPUBOOK_OIDC_MANAGER_SUFFIX", "-managers")
AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend", "accounts.oidc.OidcBackend"]
