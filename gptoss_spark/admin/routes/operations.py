"""The restart, and every operation's progress: POST /admin/restart, GET /admin/operations/{id}."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from ...service.operations import Rejected
from ..dependencies import Mutation, SupervisorDep, accepted, mutation
from ..refusal import NO_STORE, Refused

router = APIRouter()

OPERATION_ID_RE = re.compile(r"^[0-9a-f]{12}$")


class RestartBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


Restart = Annotated[Mutation[RestartBody], Depends(mutation("restart", RestartBody))]


@router.post("/admin/restart")
async def restart(request: Request, m: Restart, supervisor: SupervisorDep) -> JSONResponse:
    try:
        op = supervisor.request_restart()
    except Rejected as e:
        raise Refused.by_supervisor(m.action, e) from None
    return await accepted(request, m, op, target=op.target, op=op.id)


@router.get("/admin/operations/{op_id}")
async def get_operation(op_id: str, supervisor: SupervisorDep) -> JSONResponse:
    op = supervisor.status().operations.get(op_id) if OPERATION_ID_RE.match(op_id) else None
    if op is None:
        raise Refused(404, "unknown_operation", "no such operation (ids are kept for the last 50)")
    return JSONResponse({**op.to_json(), "poll": f"/admin/operations/{op.id}"}, headers=NO_STORE)
