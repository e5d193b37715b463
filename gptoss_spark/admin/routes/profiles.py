"""Which profile serves, which could, and the switch: GET and PUT /admin/profile."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from ...base.errors import ConfigError
from ...service.fit import why_not
from ...service.operations import Rejected
from ...service.profiles import PROFILE_NAME_RE, load_profiles
from ..dependencies import Mutation, SettingsDep, SupervisorDep, accepted, mutation
from ..refusal import NO_STORE, Refused, audit

router = APIRouter()


class SwitchBody(BaseModel):
    # Matched against a pattern here and against the loaded set by the supervisor: never a path.
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(min_length=1, max_length=32, pattern=PROFILE_NAME_RE.pattern)


Switch = Annotated[Mutation[SwitchBody], Depends(mutation("switch", SwitchBody, example='{"name": "spec"}'))]


@router.get("/admin/profile")
async def get_profile(supervisor: SupervisorDep, settings: SettingsDep) -> JSONResponse:
    st = supervisor.status()
    total_gib = st.guard.host_total_bytes / 2**30
    # The files as they are now (a new one in profiles.d is switchable at once: a switch reads
    # them too); if one is broken, the set the supervisor loaded last, and what is wrong.
    files_error = None
    try:
        on_disk = await asyncio.to_thread(load_profiles, settings)
    except ConfigError as e:
        on_disk, files_error = dict(st.profiles), str(e)
    profiles = []
    for p in sorted(on_disk.values(), key=lambda p: p.name):
        reasons = why_not(p, settings, total_gib)
        profiles.append({"name": p.name, "description": p.description, "memory_gib": p.memory_gib,
                         "active": p.name == st.profile, "runs_here": not reasons, "why_not": reasons})
    return JSONResponse({"active": st.profile, "state": st.state.value,
                         "saved": st.saved.active_profile, "last_good": st.saved.last_good_profile,
                         "profiles": profiles, "profiles_error": files_error,
                         "operation": st.operation.to_json() if st.operation else None},
                        headers=NO_STORE)


@router.put("/admin/profile")
async def put_profile(request: Request, m: Switch, supervisor: SupervisorDep) -> JSONResponse:
    name = m.body.name
    try:
        op = supervisor.request_switch(name)
    except Rejected as e:
        raise Refused.by_supervisor(m.action, e, target=name) from None
    if op is None:
        audit(request, m.action, "no-op: already active and ready", target=name)
        return JSONResponse({"status": "noop", "target": name, "state": supervisor.status().state.value,
                             "message": f"profile {name} is already active and ready"},
                            headers=NO_STORE)
    return await accepted(request, m, op, target=name, op=op.id, from_profile=op.from_profile)
