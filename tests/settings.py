"""Test settings: the real settings, with data (SQLite file, artifacts) in a fresh temp folder.

pytest-django imports this before any conftest runs, so the environment is set here; child
processes (Celery worker, serving replicas) inherit it."""

import os
import tempfile

os.environ.setdefault("MMC_DATA_DIR", tempfile.mkdtemp(prefix="mmc-test-"))
os.environ.setdefault("MMC_WARM_GRACE_SECONDS", "2")
os.environ.setdefault("MMC_HEARTBEAT_SECONDS", "0.5")
os.environ.setdefault("MMC_POLL_SECONDS", "0.5")
os.environ.setdefault("MMC_REPLICA_STALE_SECONDS", "5")
os.environ.setdefault("MMC_METRICS_BUCKET_SECONDS", "1")
# Endpoints without keys stay open unless a spec turns this on (it is on by default clustered).
os.environ.setdefault("MMC_REQUIRE_PREDICT_KEYS", "0")
os.environ.setdefault("MMC_OUTBOUND_ALLOW", "127.0.0.1/32,::1/128,localhost")  # test receivers
if os.environ.get("REDIS_URL"):
    os.environ.setdefault("SECRET_KEY", "test-only-secret-key")

from console.settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # roles, not hash strength

# A traffic loop logs every request through httpx at INFO: keep failures readable.
LOGGING = {**LOGGING, "loggers": {**LOGGING["loggers"], "httpx": {"level": "WARNING"}}}  # noqa: F405

if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":  # noqa: F405
    DATABASES["default"]["ENGINE"] = "tests.pg_backend"  # noqa: F405  a spec's flush by DELETE
