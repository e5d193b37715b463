"""The page for people at / (admin/page.py), from the same snapshot as /admin/status."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from ..dependencies import SupervisorDep
from ..page import csp, new_nonce, render_page
from ..refusal import NO_STORE

router = APIRouter()


@router.get("/")
async def status_page(supervisor: SupervisorDep) -> HTMLResponse:
    nonce = new_nonce()
    return HTMLResponse(render_page(supervisor.status(), nonce),
                        headers={**NO_STORE, "Content-Security-Policy": csp(nonce),
                                 "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"})
