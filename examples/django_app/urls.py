from __future__ import annotations

from django.urls import path

from django_app import views

urlpatterns = [path("generate", views.generate), path("complete", views.complete)]
