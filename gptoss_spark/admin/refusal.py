"""One way for the admin API to say no: raise `Refused`; one handler audits it and answers.

Every error body is `{"error": code, "message": one line}` and never cached. A refusal of a
mutation names its action, and the handler writes the audit line ("admin mutation": peer,
action, outcome) before answering, so no route can answer a refusal and forget to log it.
"""

from __future__ import annotations

from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..service.operations import Rejected

log = structlog.get_logger("gptoss_spark.admin")

NO_STORE = {"Cache-Control": "no-store"}

# Supervisor refusals (Rejected.code) -> HTTP status. The code is also in the body.
REJECTED_STATUS = {
    "busy": 409,      # another switch/restart is running
    "state": 409,     # e.g. restart before the first start
    "memory": 409,    # the host has not enough memory for the target now
    "unknown": 404,   # no such profile in the loaded set
    "invalid": 422,   # a profile file fails validation
    "unmet": 422,     # the profile's requirements (e.g. the Eagle3 head) are missing on this host
    "worker": 409,    # a cluster worker's admin API is read-only: the head drives both nodes
}


def error(status: int, code: str, message: str, headers: dict[str, str] | None = None,
          **extra: Any) -> JSONResponse:
    return JSONResponse({"error": code, "message": message, **extra}, status_code=status,
                        headers={**NO_STORE, **(headers or {})})


def peer(request: Request) -> str:
    c = request.client
    return f"{c.host}:{c.port}" if c else "unknown"


def audit(request: Request, action: str, outcome: str, level: str = "info", **fields: Any) -> None:
    getattr(log, level)("admin mutation", peer=peer(request), action=action, outcome=outcome, **fields)


class Refused(Exception):
    """A request answered with `status` and `code` that changed nothing.

    `action` names the mutation refused (the audit line's action; None for a read) and
    `outcome` what the audit line says happened; `fields` go into the audit line too."""

    def __init__(self, status: int, code: str, message: str, *, action: str | None = None,
                 outcome: str = "", level: str = "info", headers: dict[str, str] | None = None,
                 **fields: Any):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.action, self.outcome, self.level = action, outcome or f"rejected: {code}", level
        self.headers, self.fields = headers, fields

    @classmethod
    def by_supervisor(cls, action: str, e: Rejected, **fields: Any) -> "Refused":
        """The supervisor said no: its code's HTTP status, its reason in the audit line."""
        return cls(REJECTED_STATUS.get(e.code, 409), e.code, str(e), action=action, reason=str(e), **fields)


def add_handlers(app: FastAPI) -> None:
    @app.exception_handler(Refused)
    async def _refused(request: Request, exc: Refused) -> JSONResponse:
        if exc.action is not None:
            audit(request, exc.action, exc.outcome, exc.level, **exc.fields)
        return error(exc.status, exc.code, exc.message, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            return error(404, "not_found", "no such endpoint (see docs/ADMIN.md)")
        if exc.status_code == 405:
            return error(405, "method_not_allowed", f"{request.method} is not allowed here",
                         headers=dict(exc.headers or {}))
        return error(exc.status_code, "http_error", str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error(422, "invalid", "invalid request")

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.error("admin API internal error", path=request.url.path, error=f"{type(exc).__name__}: {exc}")
        return error(500, "internal", "internal error; see the service log (journalctl -u gptoss-spark)")
