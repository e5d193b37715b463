"""Is it serving, and everything the supervisor knows: /admin/health and /admin/status."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from ... import __version__
from ..dependencies import SupervisorDep
from ..refusal import NO_STORE

router = APIRouter()


@router.get("/admin/health")
async def health(supervisor: SupervisorDep) -> JSONResponse:
    st = supervisor.status()
    return JSONResponse({"status": "ok" if st.ready else "unavailable", "state": st.state.value,
                         "profile": st.profile},
                        status_code=200 if st.ready else 503, headers=NO_STORE)


@router.get("/admin/status")
async def status(supervisor: SupervisorDep) -> JSONResponse:
    return JSONResponse({**supervisor.status().to_json(), "version": __version__}, headers=NO_STORE)
