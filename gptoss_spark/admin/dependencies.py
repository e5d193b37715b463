"""What the routes ask FastAPI for (`Depends`): the supervisor and settings the app serves, and a
mutation: its token checked, its ?wait read and its JSON body validated as a pydantic model.

Order of checks on a mutation: body size (body_limit.py, before anything is parsed) -> token
(401/403/503) -> ?wait (422) -> JSON (400) -> the route's precondition, if any -> schema (422)
-> the supervisor's own validation (404/409/422, in the route). Each refusal is a `Refused`
(refusal.py), answered and audited by its one handler; a request refused anywhere along the
way changes nothing. Nothing a client sends is ever used as a path.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Generic, TypeVar

import structlog
from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from ..service.config import Settings
from ..service.operations import Operation
from ..service.status import OpStatus
from ..service.supervisor import Supervisor
from .auth import authorize
from .refusal import NO_STORE, Refused, audit, peer

log = structlog.get_logger("gptoss_spark.admin")

NAME_RULE = ("profile names are 1-32 characters: lowercase letters, digits, '-' or '_', "
             "starting with a letter or digit")

Body = TypeVar("Body", bound=BaseModel)


def supervisor_of(request: Request) -> Supervisor:
    return request.app.state.supervisor


def settings_of(request: Request) -> Settings:
    return request.app.state.settings


SupervisorDep = Annotated[Supervisor, Depends(supervisor_of)]
SettingsDep = Annotated[Settings, Depends(settings_of)]


@dataclass(frozen=True)
class Mutation(Generic[Body]):
    """A mutation that passed every check before the supervisor's: who may, and what they sent."""

    action: str   # the audit line's action: switch, restart, cluster order
    wait: bool    # ?wait=true: answer when the operation ends, not when it is accepted
    body: Body


def schema_error(err: ValidationError) -> str:
    """One line about the first problem, never echoing what the client sent."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "body"
    kind = first["type"]
    if kind == "extra_forbidden":
        return f"unknown field {loc!r}"
    if kind == "missing":
        return f"missing field {loc!r}"
    if loc == "name" and kind in ("string_pattern_mismatch", "string_too_short", "string_too_long"):
        return f"invalid profile name: {NAME_RULE}"
    if kind in ("string_type", "model_type", "model_attributes_type"):
        return f"{loc}: wrong type ({first['msg'].lower()})"
    return f"{loc}: {first['msg']}"


def _wait(raw: str | None, action: str) -> bool:
    if raw is None or raw in ("", "0", "false"):
        return False
    if raw in ("1", "true"):
        return True
    raise Refused(422, "invalid", "wait must be true or false", action=action,
                  outcome="rejected: invalid wait parameter")


def _json(raw: bytes, action: str) -> Any:
    """The body's JSON value, or None for an empty body."""
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        where = f" at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
        message = f"request body is not valid JSON{where}"
    except RecursionError:
        message = "request body is nested too deeply"
    raise Refused(400, "malformed_json", message, action=action, outcome="rejected: malformed JSON")


def mutation(action: str, model: type[Body], example: str | None = None,
             precondition: Callable[[Request, str], None] | None = None) -> Callable[..., Any]:
    """A dependency giving the route a `Mutation[model]`, or raising the first `Refused`.

    An empty body is refused with `example` if given; otherwise it means `{}` (a model without
    required fields, like restart's). `precondition(request, action)` runs after the JSON is
    read and before the schema, and raises `Refused` if this node cannot take the action."""
    hint = "" if model.model_fields else f" ({action} takes no fields)"

    async def checked(request: Request) -> Mutation[Body]:
        auth = authorize(request.headers.get("authorization"), request.app.state.settings.admin.token_file)
        if not auth.ok:
            raise Refused(auth.status, auth.code, auth.message, action=action, outcome=f"denied: {auth.code}",
                          level="warning", headers={"WWW-Authenticate": "Bearer"} if auth.status == 401 else None)
        wait = _wait(request.query_params.get("wait"), action)
        data = _json(await request.body(), action)
        if precondition is not None:
            precondition(request, action)
        if data is None:
            if example is not None:
                raise Refused(422, "invalid", f"expected a JSON object like {example}", action=action,
                              outcome="rejected: empty body")
            data = {}
        try:
            body = model.model_validate(data)
        except ValidationError as e:
            message = schema_error(e)
            raise Refused(422, "invalid", message + hint, action=action, outcome=f"rejected: {message}") from None
        return Mutation(action, wait, body)

    return checked


def _watch(request: Request, op: Operation) -> None:
    """Log the operation's end (the accept was audited), from a task the server cancels on exit."""
    who = peer(request)

    async def finished() -> None:
        await op.done.wait()
        v = op.view()
        log.info("admin operation finished", peer=who, action=v.kind.value, op=v.id, target=v.target,
                 outcome=v.status.value, error=v.error, rolled_back_to=v.rolled_back_to)
    watchers: set[asyncio.Task[None]] = request.app.state.watchers
    task = asyncio.create_task(finished(), name=f"admin-watch-{op.id}")
    watchers.add(task)
    task.add_done_callback(watchers.discard)


async def accepted(request: Request, m: Mutation[Any], op: Operation, /, **fields: Any) -> JSONResponse:
    """An operation began: audited, watched to its end, answered (202, or its end with ?wait)."""
    audit(request, m.action, "accepted", **fields)
    _watch(request, op)
    poll = f"/admin/operations/{op.id}"
    if not m.wait:
        return JSONResponse({**op.view().to_json(), "poll": poll}, status_code=202,
                            headers={**NO_STORE, "Location": poll})
    await op.done.wait()
    view = op.view()
    body = {**view.to_json(), "poll": poll}
    if view.status == OpStatus.SUCCEEDED:
        return JSONResponse(body, status_code=200, headers=NO_STORE)
    # Accepted and carried out, but it failed (and was rolled back where it could be).
    return JSONResponse({**body, "message": view.error}, status_code=500, headers=NO_STORE)
