"""Placeholder router: the SGLang-native endpoints are built on another branch and replace this file."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
