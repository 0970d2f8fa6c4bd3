"""ASGI entry point: `cd examples && uvicorn django_app.asgi:application` (async views need ASGI)."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_app.settings")
application = get_asgi_application()
