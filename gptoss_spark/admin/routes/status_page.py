"""The page for people at / (admin/page.py), from the same snapshot as /admin/status."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from ...service.fit import why_not
from ..dependencies import SettingsDep, SupervisorDep
from ..page import csp, new_nonce, render_page
from ..refusal import NO_STORE

router = APIRouter()


@router.get("/")
async def status_page(supervisor: SupervisorDep, settings: SettingsDep) -> HTMLResponse:
    nonce = new_nonce()
    st = supervisor.status()
    # The same verdict as GET /admin/profile's why_not: a profile this host cannot run is marked and disabled.
    total_gib = st.guard.host_total_bytes / 2**30
    unrunnable = {n: r for n, p in st.profiles.items() if (r := why_not(p, settings, total_gib))}
    return HTMLResponse(render_page(st, nonce, unrunnable=unrunnable),
                        headers={**NO_STORE, "Content-Security-Policy": csp(nonce),
                                 "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"})
