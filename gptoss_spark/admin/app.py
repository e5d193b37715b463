"""The admin API's routes: parse, authorize, call the supervisor, map its outcomes to HTTP.

Reads answer from one status snapshot (Supervisor.status(), service/status.py) per request;
mutations call the supervisor's request_* methods and follow the Operation they return.

Order of checks on a mutation: body size (middleware, before anything is
parsed) -> token (401/403/503) -> JSON (400) -> schema (422) -> the
supervisor's own validation (404/409/422). A request refused anywhere along
the way changes nothing. Profile names are matched against a pattern and then
against the loaded set; nothing a client sends is ever used as a path.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..service.config import Settings
from ..service.fit import why_not
from ..base.errors import ConfigError
from ..service.profiles import PROFILE_NAME_RE, load_profiles
from ..service.status import OpStatus
from .auth import authorize, check_token_file_mode
from .metrics import make_registry, render
from .page import csp, new_nonce, render_page

if TYPE_CHECKING:
    from ..service.operations import Operation
    from ..service.supervisor import Supervisor

log = structlog.get_logger("gptoss_spark.admin")

# Bodies here are one short JSON object; anything larger is refused unread.
MAX_BODY_BYTES = 4096
OPERATION_ID_RE = re.compile(r"^[0-9a-f]{12}$")
NAME_RULE = ("profile names are 1-32 characters: lowercase letters, digits, '-' or '_', "
             "starting with a letter or digit")

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

NO_STORE = {"Cache-Control": "no-store"}


class SwitchBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(min_length=1, max_length=32, pattern=PROFILE_NAME_RE.pattern)


class RestartBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def error(status: int, code: str, message: str, headers: dict[str, str] | None = None,
          **extra: Any) -> JSONResponse:
    return JSONResponse({"error": code, "message": message, **extra}, status_code=status,
                        headers={**NO_STORE, **(headers or {})})


class BodyLimitMiddleware:
    """Refuse request bodies over max_bytes with 413, by Content-Length or while streaming.

    The body is buffered (it is at most max_bytes) and replayed to the app, so
    an oversized chunked body never reaches the JSON parser.
    """

    def __init__(self, app: Callable[..., Awaitable[None]], max_bytes: int = MAX_BODY_BYTES):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        too_large = error(413, "body_too_large", f"request body over {self.max_bytes} bytes")
        client = scope.get("client")
        peer = f"{client[0]}:{client[1]}" if client else "unknown"
        for k, v in scope.get("headers", []):
            if k == b"content-length":
                try:
                    length = int(v)
                except ValueError:
                    await error(400, "bad_request", "invalid Content-Length")(scope, receive, send)
                    return
                if length > self.max_bytes:
                    log.warning("admin request refused", peer=peer, path=scope["path"], outcome="body too large")
                    await too_large(scope, receive, send)
                    return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                log.warning("admin request refused", peer=peer, path=scope["path"], outcome="body too large")
                await too_large(scope, receive, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _peer(request: Request) -> str:
    c = request.client
    return f"{c.host}:{c.port}" if c else "unknown"


def _schema_error(err: ValidationError) -> str:
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


def create_app(supervisor: "Supervisor", settings: Settings | None = None) -> FastAPI:
    from ..service.operations import Rejected  # lazily: keep `import admin.auth` light

    settings = settings or supervisor.settings
    token_file = settings.admin.token_file
    registry = make_registry(supervisor.status)
    watchers: set[asyncio.Task[None]] = set()

    warning = check_token_file_mode(token_file)
    if warning:
        log.warning(warning)

    # No docs, no OpenAPI schema: no dev-mode endpoints on a service port.
    app = FastAPI(title="gptoss-spark admin", version=__version__, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.add_middleware(BodyLimitMiddleware, max_bytes=MAX_BODY_BYTES)
    app.state.watchers = watchers  # cancelled by the server on exit

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

    def audit(request: Request, action: str, outcome: str, level: str = "info", **fields: Any) -> None:
        getattr(log, level)("admin mutation", peer=_peer(request), action=action, outcome=outcome, **fields)

    def watch(op: "Operation", peer: str) -> None:
        async def finished() -> None:
            await op.done.wait()
            v = op.view()
            log.info("admin operation finished", peer=peer, action=v.kind.value, op=v.id, target=v.target,
                     outcome=v.status.value, error=v.error, rolled_back_to=v.rolled_back_to)
        task = asyncio.create_task(finished(), name=f"admin-watch-{op.id}")
        watchers.add(task)
        task.add_done_callback(watchers.discard)

    async def read_json(request: Request) -> tuple[Any, JSONResponse | None]:
        raw = await request.body()
        if not raw.strip():
            return None, None
        try:
            return json.loads(raw), None
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            where = f" at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
            return None, error(400, "malformed_json", f"request body is not valid JSON{where}")
        except RecursionError:
            return None, error(400, "malformed_json", "request body is nested too deeply")

    def wait_param(request: Request) -> bool | JSONResponse:
        raw = request.query_params.get("wait")
        if raw is None or raw in ("", "0", "false"):
            return False
        if raw in ("1", "true"):
            return True
        return error(422, "invalid", "wait must be true or false")

    async def operation_response(request: Request, op: "Operation", wait: bool) -> JSONResponse:
        poll = f"/admin/operations/{op.id}"
        if not wait:
            return JSONResponse({**op.view().to_json(), "poll": poll}, status_code=202,
                                headers={**NO_STORE, "Location": poll})
        await op.done.wait()
        view = op.view()
        body = {**view.to_json(), "poll": poll}
        if view.status == OpStatus.SUCCEEDED:
            return JSONResponse(body, status_code=200, headers=NO_STORE)
        # Accepted and carried out, but it failed (and was rolled back where it could be).
        return JSONResponse({**body, "message": view.error}, status_code=500, headers=NO_STORE)

    def validated(request: Request, action: str, model: type, data: Any,
                  hint: str = "") -> tuple[Any, JSONResponse | None]:
        """(the body as `model`, None), or (None, a 422 naming the field) with the refusal audited."""
        try:
            return model.model_validate(data), None
        except ValidationError as e:
            message = _schema_error(e)
            audit(request, action, f"rejected: {message}")
            return None, error(422, "invalid", message + hint)

    def refused(request: Request, action: str, e: "Rejected", **fields: Any) -> JSONResponse:
        """The supervisor said no: audited, answered with its code's HTTP status."""
        audit(request, action, f"rejected: {e.code}", **fields, reason=str(e))
        return error(REJECTED_STATUS.get(e.code, 409), e.code, str(e))

    async def accepted(request: Request, action: str, operation: "Operation", wait: bool,
                       **fields: Any) -> JSONResponse:
        """An operation began: audited, watched to its end, answered (202, or its end with ?wait)."""
        audit(request, action, "accepted", **fields)
        watch(operation, _peer(request))
        return await operation_response(request, operation, wait)

    async def mutation_preamble(request: Request, action: str) -> tuple[Any, bool, JSONResponse | None]:
        auth = authorize(request.headers.get("authorization"), token_file)
        if not auth.ok:
            audit(request, action, f"denied: {auth.code}", level="warning")
            headers = {"WWW-Authenticate": "Bearer"} if auth.status == 401 else None
            return None, False, error(auth.status, auth.code, auth.message, headers=headers)
        wait = wait_param(request)
        if isinstance(wait, JSONResponse):
            audit(request, action, "rejected: invalid wait parameter")
            return None, False, wait
        data, bad = await read_json(request)
        if bad is not None:
            audit(request, action, "rejected: malformed JSON")
            return None, False, bad
        return data, wait, None

    # ---- reads ------------------------------------------------------------------------------

    @app.get("/")
    async def status_page() -> HTMLResponse:
        # A page for people (admin/page.py), from the same snapshot as /admin/status.
        nonce = new_nonce()
        return HTMLResponse(render_page(supervisor.status(), nonce),
                            headers={**NO_STORE, "Content-Security-Policy": csp(nonce),
                                     "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"})

    @app.get("/admin/health")
    async def health() -> JSONResponse:
        st = supervisor.status()
        return JSONResponse({"status": "ok" if st.ready else "unavailable", "state": st.state.value,
                             "profile": st.profile},
                            status_code=200 if st.ready else 503, headers=NO_STORE)

    @app.get("/admin/profile")
    async def get_profile() -> JSONResponse:
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

    @app.get("/admin/status")
    async def status() -> JSONResponse:
        return JSONResponse({**supervisor.status().to_json(), "version": __version__}, headers=NO_STORE)

    @app.get("/admin/operations/{op_id}")
    async def get_operation(op_id: str) -> JSONResponse:
        op = supervisor.status().operations.get(op_id) if OPERATION_ID_RE.match(op_id) else None
        if op is None:
            return error(404, "unknown_operation", "no such operation (ids are kept for the last 50)")
        return JSONResponse({**op.to_json(), "poll": f"/admin/operations/{op.id}"}, headers=NO_STORE)

    @app.get("/admin/cluster")
    async def get_cluster() -> JSONResponse:
        # This node's half of a two-node engine: what the other node's supervisor polls (cluster.py).
        cluster = supervisor.status().cluster
        if cluster is None:
            return error(404, "not_clustered", "this node has no [cluster] setting (docs/CLUSTER.md)")
        return JSONResponse(cluster.node.to_json(), headers=NO_STORE)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(render(registry), media_type="text/plain; version=0.0.4; charset=utf-8",
                        headers=NO_STORE)

    # ---- mutations --------------------------------------------------------------------------

    @app.put("/admin/profile")
    async def put_profile(request: Request) -> JSONResponse:
        data, wait, bad = await mutation_preamble(request, "switch")
        if bad is not None:
            return bad
        if data is None:
            audit(request, "switch", "rejected: empty body")
            return error(422, "invalid", 'expected a JSON object like {"name": "spec"}')
        body, bad = validated(request, "switch", SwitchBody, data)
        if bad is not None:
            return bad
        try:
            op = supervisor.request_switch(body.name)
        except Rejected as e:
            return refused(request, "switch", e, target=body.name)
        if op is None:
            audit(request, "switch", "no-op: already active and ready", target=body.name)
            return JSONResponse({"status": "noop", "target": body.name, "state": supervisor.status().state.value,
                                 "message": f"profile {body.name} is already active and ready"},
                                headers=NO_STORE)
        return await accepted(request, "switch", op, wait, target=body.name, op=op.id, from_profile=op.from_profile)

    @app.post("/admin/restart")
    async def restart(request: Request) -> JSONResponse:
        data, wait, bad = await mutation_preamble(request, "restart")
        if bad is not None:
            return bad
        _, bad = validated(request, "restart", RestartBody, {} if data is None else data,
                           hint=" (restart takes no fields)")
        if bad is not None:
            return bad
        try:
            op = supervisor.request_restart()
        except Rejected as e:
            return refused(request, "restart", e)
        return await accepted(request, "restart", op, wait, target=op.target, op=op.id)

    @app.post("/admin/cluster/order")
    async def cluster_order(request: Request) -> JSONResponse:
        from ..service.cluster import OrderBody

        data, _, bad = await mutation_preamble(request, "cluster order")
        if bad is not None:
            return bad
        cluster = supervisor.status().cluster
        role = cluster.node.role if cluster else None
        if role != "worker":
            audit(request, "cluster order", "rejected: not a cluster worker")
            return error(409, "not_worker", "only a cluster worker takes orders; this node's role is "
                                            f"{role or 'single'}")
        body, bad = validated(request, "cluster order", OrderBody, data)
        if bad is not None:
            return bad
        supervisor.order_from_head(body.generation, body.profile, body.run)
        audit(request, "cluster order", "accepted", generation=body.generation, target=body.profile, run=body.run)
        after = supervisor.status().cluster
        assert after is not None
        return JSONResponse(after.node.to_json(), headers=NO_STORE)

    return app
