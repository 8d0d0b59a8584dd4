"""Settings from the environment (django-environ), with defaults that run embedded.

Embedded: SQLite + local artifact folder + in-process tasks, no REDIS_URL.
Clustered: DATABASE_URL=postgres://..., REDIS_URL=redis://..., SECRET_KEY required.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from pathlib import Path

import environ

from serving.core.logs import line_format

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()

DATA_DIR = Path(env.str("MMC_DATA_DIR", default=str(BASE_DIR / "data"))).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)

REDIS_URL = env.str("REDIS_URL", default="")
CLUSTERED = bool(REDIS_URL)
# Where every replica counts daily quotas (serving.core.rate_limits) and the console reads them:
# the same Redis for both sides; replicas that follow the console over HTTP get this URL alone
# (not the broker's), so give it a Redis database of its own, or an ACL user for mmc:quota:*.
QUOTA_REDIS_URL = env.str("MMC_QUOTA_REDIS_URL", default="") or REDIS_URL
DEBUG = env.bool("DEBUG", default=False)


def _secret_key() -> str:
    """Clustered mode must share one key across processes; embedded keeps a generated one."""
    if CLUSTERED:
        return env.str("SECRET_KEY")
    if key := env.str("SECRET_KEY", default=""):
        return key
    path = DATA_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{DATA_DIR / 'mmc.sqlite3'}")}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # WAL + IMMEDIATE: the validation thread and request threads write concurrently in embedded
    # mode; IMMEDIATE takes the write lock up front instead of failing on lock upgrade.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / "test.sqlite3")}
else:
    # 0: a connection per request, closed when it ends. Under ASGI each request runs on its own
    # thread, so a persistent (per-thread) connection outlives its request until garbage
    # collection: 38 stayed open after one Redis hang (bench/faults.py), and a few hundred
    # exhaust PostgreSQL. A local connect costs ~2 ms; put a pooler in front for more.
    DATABASES["default"]["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=0)
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    # A database that does not answer fails a request in seconds (503), never hangs it.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"connect_timeout": env.int("MMC_DB_CONNECT_TIMEOUT", default=5)})

ARTIFACT_ROOT = Path(env.str("ARTIFACT_ROOT", default=str(DATA_DIR / "artifacts"))).resolve()
# Where model artifacts live: empty = the folder ARTIFACT_ROOT (a local disk or a ReadWriteMany
# volume); s3://bucket/prefix = an S3-compatible object store (registry/store/s3.py), with
# ARTIFACT_ROOT keeping only the upload spool, job files and a verified cache of blobs. The
# endpoint comes from AWS_ENDPOINT_URL (empty = AWS), credentials from boto3's usual chain
# (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_DEFAULT_REGION, ~/.aws, an instance role).
# s3:// needs the [s3] extra (boto3): without it a system check stops start-up, naming it.
ARTIFACT_STORE = env.str("ARTIFACT_STORE", default="")
AWS_ENDPOINT_URL = env.str("AWS_ENDPOINT_URL", default="")
MAX_UPLOAD_BYTES = env.int("MMC_MAX_UPLOAD_BYTES", default=2 * 1024**3)
# Raw uploads (PUT …/versions/upload/) one user may have in progress at once, per console
# process; one more is refused (429) before its body is read. 0: no cap.
MAX_UPLOADS_PER_USER = env.int("MMC_MAX_UPLOADS_PER_USER", default=2)
TRT_CACHE_DIR = Path(env.str("MMC_TRT_CACHE_DIR", default=str(DATA_DIR / "trt-cache"))).resolve()
# Comma-separated execution providers to pin (e.g. "CPUExecutionProvider"); empty = best available.
ORT_PROVIDERS = env.list("MMC_PROVIDERS", default=[])
# Seconds a previous stable stays loaded after promote/rollback so going back is instant.
WARM_GRACE_SECONDS = env.int("MMC_WARM_GRACE_SECONDS", default=300)
# Embedded: the console process also serves /v2 (one process). Clustered: replicas do.
EMBED_SERVING = env.bool("MMC_EMBED_SERVING", default=not CLUSTERED)
REPLICA_HEARTBEAT_SECONDS = env.float("MMC_HEARTBEAT_SECONDS", default=2.0)
REPLICA_POLL_SECONDS = env.float("MMC_POLL_SECONDS", default=1.0)
# A replica credential given to both sides by the environment (compose, Kubernetes), beside the
# ones an admin makes in the console (Replicas page); empty: none.
REPLICA_TOKEN = env.str("MMC_REPLICA_TOKEN", default="")
# The longest a replica's desired-state request waits for a new revision (long poll).
REPLICA_WAIT_SECONDS = env.float("MMC_REPLICA_WAIT_SECONDS", default=25.0)
# Per-version metrics kept for dashboards and canary analysis: bucket width and retention.
METRICS_BUCKET_SECONDS = env.int("MMC_METRICS_BUCKET_SECONDS", default=5)
# History tiers (registry/metrics_retention.py): every sample for an hour, the last of each minute
# for a day, the last of each 10 minutes for the retention (8 days: a week back always charts).
METRICS_FINE_SECONDS = env.int("MMC_METRICS_FINE_SECONDS", default=3600)
METRICS_MINUTE_SECONDS = env.int("MMC_METRICS_MINUTE_SECONDS", default=24 * 3600)
METRICS_RETENTION_SECONDS = env.int("MMC_METRICS_RETENTION_SECONDS", default=8 * 24 * 3600)
METRICS_COMPACT_SECONDS = env.float("MMC_METRICS_COMPACT_SECONDS", default=60.0)
# A replica not heard from for this long is "lost": listed, named by ?wait, degraded health.
REPLICA_STALE_SECONDS = env.float("MMC_REPLICA_STALE_SECONDS", default=10.0)
# A lost replica no one removed is forgotten (audited) after this long silent.
REPLICA_FORGET_SECONDS = env.float("MMC_REPLICA_FORGET_SECONDS", default=24 * 3600.0)
# A live replica behind the current revision is "converging" this long, then "degraded".
REPLICA_CONVERGE_SECONDS = env.float("MMC_REPLICA_CONVERGE_SECONDS", default=30.0)
# Every endpoint needs a predict key: one without any refuses all inference (401) until a key is
# created. On by default clustered (shared, networked), off embedded (one person's machine).
REQUIRE_PREDICT_KEYS = env.bool("MMC_REQUIRE_PREDICT_KEYS", default=CLUSTERED)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "knox",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "axes",
    "csp",
    "registry",
    "console",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "registry.middleware.RequestContextMiddleware",
    "axes.middleware.AxesMiddleware",  # last, as axes asks: turns a lockout into its 429 page
]

ROOT_URLCONF = "console.urls"
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
ASGI_APPLICATION = "console.asgi.application"
WSGI_APPLICATION = "console.wsgi.application"

# Login throttling (django-axes): the first backend refuses a locked-out client before any
# password is checked; every login form (console, Django admin) goes through it.
AUTHENTICATION_BACKENDS = [
    "registry.services.lockouts.LoginThrottleBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env.int("MMC_LOGIN_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=env.float("MMC_LOGIN_COOLOFF_MINUTES", default=15))
# A username is locked from the address that failed, so an attacker elsewhere cannot lock the
# real user out; "ip_address" alone (MMC_LOGIN_LOCKOUT_BY=ip_address) also stops spraying.
AXES_LOCKOUT_PARAMETERS = [env.list("MMC_LOGIN_LOCKOUT_BY", default=["username", "ip_address"])]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
# The client address is REMOTE_ADDR unless an operator names the header their proxy sets
# (e.g. HTTP_X_FORWARDED_FOR): a header a client can send itself would let it dodge the lockout.
AXES_IPWARE_META_PRECEDENCE_ORDER = env.list("MMC_CLIENT_IP_HEADERS", default=["REMOTE_ADDR"])
AXES_IPWARE_PROXY_COUNT = env.int("MMC_PROXY_COUNT", default=None)
AXES_VERBOSE = False
# The single sign-on callback is no password login: axes neither refuses nor counts it (the
# provider throttles its own password form); see console.sso.
AXES_WHITELIST_CALLABLE = "console.sso.backend.is_sso_callback"

# Single sign-on (OpenID Connect, mozilla-django-oidc): off unless an issuer is set. Endpoints
# and signing keys come from the issuer's discovery document (console.sso.provider).
OIDC_ISSUER = env.str("MMC_OIDC_ISSUER", default="")
SSO_ENABLED = bool(OIDC_ISSUER)
OIDC_RP_CLIENT_ID = env.str("MMC_OIDC_CLIENT_ID", default="")
OIDC_RP_CLIENT_SECRET = env.str("MMC_OIDC_CLIENT_SECRET", default="")
OIDC_RP_SCOPES = env.str("MMC_OIDC_SCOPES", default="openid email profile")
OIDC_GROUPS_CLAIM = env.str("MMC_OIDC_GROUPS_CLAIM", default="groups")
OIDC_USERNAME_CLAIM = env.str("MMC_OIDC_USERNAME_CLAIM", default="preferred_username")
# "ml-admins=admin,ml-eng=engineer,ml-read=viewer": provider group -> console role.
OIDC_ROLE_MAP = env.dict("MMC_OIDC_ROLE_MAP", default={})
# provider group -> "team:role" (a team role; the provider is the source of truth for those teams)
OIDC_TEAM_MAP = env.dict("MMC_OIDC_TEAM_MAP", default={})
OIDC_CREATE_USER = env.bool("MMC_OIDC_CREATE_USERS", default=True)
OIDC_LABEL = env.str("MMC_OIDC_LABEL", default="Sign in with single sign-on")
OIDC_RP_SIGN_ALGO = "RS256"  # only RS256 ID tokens, checked against the provider's JWKS
OIDC_USE_PKCE = True
OIDC_PKCE_CODE_CHALLENGE_METHOD = "S256"
OIDC_USE_NONCE = True
OIDC_TOKEN_USE_BASIC_AUTH = True  # client_secret_basic, the method every provider supports
OIDC_TIMEOUT = env.float("MMC_OIDC_TIMEOUT_SECONDS", default=10.0)
OIDC_AUTHENTICATION_CALLBACK_URL = "console:sso-callback"
if SSO_ENABLED:
    AUTHENTICATION_BACKENDS.append("console.sso.backend.SsoBackend")
# API tokens: each user may create this many per period (DRF throttle; "20/hour"), by the API
# or on the console's tokens page.
TOKEN_CREATE_RATE = env.str("MMC_TOKEN_CREATE_RATE", default="20/hour")
# Password logins for an API token (`mmc login`) per client address; wrong passwords also count
# towards the axes lockout above.
TOKEN_LOGIN_RATE = env.str("MMC_TOKEN_LOGIN_RATE", default="20/hour")

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env.str("STATIC_ROOT", default=str(DATA_DIR / "staticfiles")))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
WHITENOISE_USE_FINDERS = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Uploads stream to disk, hashed on the way, never whole in memory.
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
(ARTIFACT_ROOT / "tmp").mkdir(parents=True, exist_ok=True)
FILE_UPLOAD_TEMP_DIR = str(ARTIFACT_ROOT / "tmp")
DATA_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024 * 1024

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE = env.bool("SECURE_COOKIES", default=CLUSTERED)
X_FRAME_OPTIONS = "DENY"
# Content-Security-Policy (django-csp): our own static files only (htmx is served from
# django-htmx's static files), no inline script or style, no eval, no framing.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "registry.api.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["registry.api.permissions.RolePermission"],
    "DEFAULT_PAGINATION_CLASS": "registry.api.pagination.Pagination",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "registry.api.schema.AutoSchema",  # + the error answers
    "DEFAULT_PARSER_CLASSES": ["registry.api.parsers.JSONParser"],  # bounded size and depth
    "EXCEPTION_HANDLER": "registry.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
KNOX_TOKEN_MODEL = "registry.ApiToken"
# knox's own AuthToken is swapped out for ours; its migrations would still create an unused table
# whose foreign key blocks PostgreSQL's TRUNCATE of auth_user.
MIGRATION_MODULES = {"knox": None}
REST_KNOX = {
    "AUTH_HEADER_PREFIX": "Bearer",
    "TOKEN_TTL": timedelta(days=env.int("MMC_TOKEN_TTL_DAYS", default=90)),
    "TOKEN_PREFIX": "mmc_",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Model management console API",
    "DESCRIPTION": "Registry, rollouts and serving control for ONNX models. "
    "Authenticate with `Authorization: Bearer <token>`.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Operations grouped by resource (models, tokens, …) rather than all under "v1".
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    # /api/docs/ works offline: Swagger UI comes from the drf-spectacular-sidecar package.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Three models have a `status`: name each enumeration after its own set.
    "ENUM_NAME_OVERRIDES": {
        "VersionStatusEnum": "registry.choices.VersionStatus",
        "JobStatusEnum": "registry.models.JobStatus",
        "WebhookDeliveryStatusEnum": "registry.models.DeliveryStatus",
        "ApprovalEnum": "registry.choices.ApprovalState",
    },
}

# Celery (clustered only; embedded mode runs tasks on an in-process worker thread).
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Every broker call has a timeout, so a hung Redis costs a request one timeout, never a thread
# for good: a send is not retried (a retry reconnects and health-checks, a timeout each: 9 s
# measured with retries=1 and 3 s), and redis-py itself replaces a connection Redis dropped; an
# unsent task is left to the recovery tick.
BROKER_TIMEOUT_SECONDS = env.float("MMC_BROKER_TIMEOUT_SECONDS", default=2.0)
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env.int("MMC_TASK_VISIBILITY", 600),
    "socket_timeout": BROKER_TIMEOUT_SECONDS,  # > kombu's 1 s BRPOP wait
    "socket_connect_timeout": BROKER_TIMEOUT_SECONDS,
    "socket_keepalive": True,
    "health_check_interval": 10,
}
CELERY_BROKER_CONNECTION_TIMEOUT = BROKER_TIMEOUT_SECONDS
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 0}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A validation's worker renews its lease every third of this; one silent this long (worker
# killed, message never sent) is queued again by the recovery tick.
VALIDATION_LEASE_SECONDS = env.float("MMC_VALIDATION_LEASE_SECONDS", default=15.0)
# Converting a too-new model down to what onnxruntime loads runs in the request (see
# registry/services/conversion.py): artifacts over this size are refused with the reason.
CONVERT_MAX_BYTES = env.int("MMC_CONVERT_MAX_BYTES", default=64 * 1024**2)
# The equivalence check (both models on generated inputs) runs in a child process with this much
# address space beyond what its runtimes take to start, and this long (wall clock): past either
# the conversion is refused (422) naming the limit.
CONVERT_MEMORY_BYTES = env.int("MMC_CONVERT_MEMORY_BYTES", default=1024**3)
CONVERT_TIMEOUT_S = env.float("MMC_CONVERT_TIMEOUT_S", default=60.0)
CONVERT_RTOL = env.float("MMC_CONVERT_RTOL", default=1e-4)  # equivalence tolerance, stated
CONVERT_ATOL = env.float("MMC_CONVERT_ATOL", default=1e-5)  # in every conversion's record

# Jobs (registry.jobs): async inference bodies and batch datasets live under ARTIFACT_ROOT/jobs/.
ASYNC_MAX_BYTES = env.int("MMC_ASYNC_MAX_BYTES", default=1024**3)
ASYNC_RESULT_TTL = env.int("MMC_ASYNC_RESULT_TTL", default=24 * 3600)
BATCH_RESULT_TTL = env.int("MMC_BATCH_RESULT_TTL", default=7 * 24 * 3600)
# A dataset's file is deleted this long after its last use (upload or a batch job started).
DATASET_TTL = env.int("MMC_DATASET_TTL", default=7 * 24 * 3600)
# A running job whose worker has not renewed its lease for this long is taken over (resumed).
JOB_LEASE_SECONDS = env.float("MMC_JOB_LEASE_SECONDS", default=10.0)
JOB_MAX_ATTEMPTS = env.int("MMC_JOB_MAX_ATTEMPTS", default=5)
JOB_CHUNK_ROWS = env.int("MMC_JOB_CHUNK_ROWS", default=10_000)
# Load tests of a version (registry.jobs.loadtest): at most this long, this many requests in
# flight, this many requests; a request beyond is refused (400).
LOADTEST_MAX_SECONDS = env.int("MMC_LOADTEST_MAX_SECONDS", default=60)
LOADTEST_MAX_CONCURRENCY = env.int("MMC_LOADTEST_MAX_CONCURRENCY", default=32)
LOADTEST_MAX_REQUESTS = 100_000
# A version no slot references is loaded for its test: how long the job waits for the replica.
LOADTEST_LOAD_SECONDS = env.int("MMC_LOADTEST_LOAD_SECONDS", default=60)
JOB_TICK_SECONDS = env.float("MMC_JOB_TICK_SECONDS", default=30.0)
# Re-queues validations and jobs whose lease lapsed: a killed worker's work resumes within a
# lease plus this (10 + 5 s by default).
RECOVERY_TICK_SECONDS = env.float("MMC_RECOVERY_TICK_SECONDS", default=5.0)
# Automated canary analysis and rollout housekeeping (0 turns the embedded scheduler's off).
ROLLOUT_TICK_SECONDS = env.float("MMC_ROLLOUT_TICK_SECONDS", default=5.0)
# The analysis is stale when its tick has not finished for this long (Celery beat or Redis down,
# the scheduler hung): health is degraded, a canary with a plan may not start, and a running one
# drops its candidate's weight to 0 (registry.services.analysis_watch). A process whose own tick
# is off (0: it runs elsewhere) judges by the same record. At least 30 s: a clustered tick shares
# the Celery queue with validations, and a busy worker must not read as a silent analysis.
ANALYSIS_STALE_SECONDS = env.float("MMC_ANALYSIS_STALE_SECONDS",
                                   default=max(30.0, 3 * (ROLLOUT_TICK_SECONDS or 5.0)))
# Artifact garbage collection (0 turns it off): blobs no version references and temp files of
# crashed uploads, once older than the grace period (an upload writes its blob before its
# version row commits; an upload in progress keeps its temp file's mtime fresh).
GC_SECONDS = env.float("MMC_GC_SECONDS", default=3600.0)
GC_GRACE_SECONDS = env.float("MMC_GC_GRACE_SECONDS", default=3600.0)
# The health bar says the artifact store is degraded below this much free space, and a request
# body that would leave less (its declared size; a raw upload's as it arrives) is refused (507).
STORE_MIN_FREE_BYTES = env.int("MMC_STORE_MIN_FREE_BYTES", default=1024**3)
# Versions validated before the weights hash existed get it in the background, this many per run.
WEIGHTS_BACKFILL_SECONDS = env.float("MMC_WEIGHTS_BACKFILL_SECONDS", default=600.0)
WEIGHTS_BACKFILL_BATCH = env.int("MMC_WEIGHTS_BACKFILL_BATCH", default=20)
# Model quality (registry/monitoring/quality.py): how often feedback is joined with captured
# predictions and quality computed (0: off), the width of one quality window, how far before a
# feedback's arrival its captured prediction is looked for (and how long an unknown request id
# is tried again), and the most labels one feedback request may carry.
QUALITY_SECONDS = env.float("MMC_QUALITY_SECONDS", default=300.0)
QUALITY_WINDOW_SECONDS = env.int("MMC_QUALITY_WINDOW_SECONDS", default=3600)
FEEDBACK_LOOKBACK_SECONDS = env.int("MMC_FEEDBACK_LOOKBACK_SECONDS", default=86400)
FEEDBACK_MAX_BATCH = env.int("MMC_FEEDBACK_MAX_BATCH", default=1000)
# How often each deployed version's recent capture is compared with its baseline (0: off).
DRIFT_SECONDS = env.float("MMC_DRIFT_SECONDS", default=300.0)
# Periodic background tasks (registry/tasks.py): Celery beat runs them clustered, the embedded
# process's scheduler thread otherwise.
PERIODIC_TASKS = {"registry.rollout_tick": ROLLOUT_TICK_SECONDS,
                  "registry.analysis_watch": ROLLOUT_TICK_SECONDS,
                  "registry.jobs_tick": JOB_TICK_SECONDS,
                  "registry.recovery_tick": RECOVERY_TICK_SECONDS,
                  "registry.gc_artifacts": GC_SECONDS,
                  "registry.metrics_compact": METRICS_COMPACT_SECONDS,
                  "registry.weights_backfill": WEIGHTS_BACKFILL_SECONDS,
                  "registry.quality_tick": QUALITY_SECONDS,
                  "registry.drift_tick": DRIFT_SECONDS}
CELERY_BEAT_SCHEDULE = {name: {"task": name, "schedule": seconds}
                        for name, seconds in PERIODIC_TASKS.items() if seconds > 0}
# KServe export (registry/integrations/kserve.py): where InferenceServices find the artifact store
# (the ReadWriteMany claim of deploy/kubernetes as KServe mounts it, or the object store's URI),
# and the images of the two serving runtimes it can write.
KSERVE_STORAGE_URI = env.str("MMC_KSERVE_STORAGE_URI", default="pvc://mmc-artifacts")
KSERVE_IMAGE = env.str("MMC_KSERVE_IMAGE", default="mmc:latest")
KSERVE_TRITON_IMAGE = env.str("MMC_KSERVE_TRITON_IMAGE",
                              default="nvcr.io/nvidia/tritonserver:24.10-py3")
# Default HMAC-SHA256 key for completion callbacks when a job brings none of its own.
JOB_CALLBACK_SECRET = env.str("MMC_CALLBACK_SECRET", default="")
# Webhooks and job callbacks reach public addresses only; this comma list admits more: networks
# (10.20.0.0/16, ::1/128), host names (hooks.internal) or domains (.corp.example).
OUTBOUND_ALLOW = env.list("MMC_OUTBOUND_ALLOW", default=[])

# MMC_LOG_FORMAT=json: one JSON object per line (python-json-logger) with the request's
# request_id and, while tracing (OTEL_*), its trace_id; "text" (default): a line of text.
LOG_FORMAT = line_format(env.ENVIRON)  # checked: its package named when it is missing
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
                   **({"json": {"()": "serving.core.logs.JsonFormatter"}}
                      if LOG_FORMAT == "json" else {})},
    "filters": {"expected_errors": {"()": "registry.logfilters.ExpectedErrorLogFilter"},
                "request_context": {"()": "serving.core.logs.RequestContext"}},
    "handlers": {"console": {"class": "logging.StreamHandler",
                             "formatter": "json" if LOG_FORMAT == "json" else "plain",
                             "filters": ["request_context"]}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {"django.server": {"level": "WARNING"},
                "django.request": {"filters": ["expected_errors"]}},
}
