"""Settings of the test OpenID provider. Everything it keeps lives in OP_DIR; OP_ISSUER is the
issuer URL it announces (it listens there)."""

import os
from pathlib import Path

DIR = Path(os.environ["OP_DIR"])
ISSUER = os.environ["OP_ISSUER"]

SECRET_KEY = "test-openid-provider-only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "oauth2_provider",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
ROOT_URLCONF = "tests.oidc_provider.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "DIRS": [Path(__file__).resolve().parent / "templates"],
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
}]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": DIR / "op.sqlite3"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
LOGIN_URL = "/accounts/login/"
# Its own cookie names: browsers keep cookies per host, not per port.
SESSION_COOKIE_NAME = "op_session"
CSRF_COOKIE_NAME = "op_csrftoken"

OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_ISS_ENDPOINT": ISSUER,
    "OIDC_RSA_PRIVATE_KEY": (DIR / "signing-key.pem").read_text(),
    "PKCE_REQUIRED": True,
    "SCOPES": {"openid": "Sign you in", "profile": "Your user name",
               "email": "Your e-mail address"},
    "OAUTH2_VALIDATOR_CLASS": "tests.oidc_provider.validators.GroupsValidator",
}
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "handlers": {"stderr": {"class": "logging.StreamHandler"}},
           "root": {"level": "WARNING", "handlers": ["stderr"]}}
