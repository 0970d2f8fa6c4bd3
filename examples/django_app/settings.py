"""The smallest Django project that serves radixserve: one async view, no database."""

from __future__ import annotations

import os

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
ROOT_URLCONF = "django_app.urls"
INSTALLED_APPS: list[str] = []
MIDDLEWARE: list[str] = []
DATABASES: dict[str, dict[str, str]] = {}
USE_TZ = True
# The model the shared engine loads (the embedded default unless told otherwise).
RADIXSERVE_MODEL = os.environ.get("RADIXSERVE_MODEL", "smollm2-135m-instruct")
RADIXSERVE_DEVICE = os.environ.get("RADIXSERVE_DEVICE", "auto")
