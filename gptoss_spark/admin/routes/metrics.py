"""Prometheus text at /metrics, from the app's private registry (admin/metrics.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..metrics import render
from ..refusal import NO_STORE

router = APIRouter()


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(render(request.app.state.registry), media_type="text/plain; version=0.0.4; charset=utf-8",
                    headers=NO_STORE)
