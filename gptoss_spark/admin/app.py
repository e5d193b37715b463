"""The admin API: a thin FastAPI app over the Supervisor. It parses, authorizes, calls the
supervisor and maps its outcomes to HTTP; it never touches processes.

The routes are routers per concern (routes/), given the supervisor and the settings through
`Depends` (dependencies.py); every refusal is one exception answered and audited by one handler
(refusal.py); bodies are bounded before anything reads them (body_limit.py).
"""

from __future__ import annotations

import asyncio

import structlog
from fastapi import FastAPI

from .. import __version__
from ..service.config import Settings
from ..service.supervisor import Supervisor
from .auth import check_token_file_mode
from .body_limit import MAX_BODY_BYTES, BodyLimitMiddleware
from .metrics import make_registry
from .refusal import add_handlers
from .routes import cluster, health, metrics, operations, profiles, status_page

log = structlog.get_logger("gptoss_spark.admin")

ROUTERS = (health.router, profiles.router, operations.router, cluster.router, metrics.router,
           status_page.router)


def create_app(supervisor: Supervisor, settings: Settings | None = None) -> FastAPI:
    settings = settings or supervisor.settings
    warning = check_token_file_mode(settings.admin.token_file)
    if warning:
        log.warning(warning)
    # No docs, no OpenAPI schema: no dev-mode endpoints on a service port.
    app = FastAPI(title="gptoss-spark admin", version=__version__, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.add_middleware(BodyLimitMiddleware, max_bytes=MAX_BODY_BYTES)
    add_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    app.state.supervisor = supervisor
    app.state.settings = settings
    app.state.registry = make_registry(supervisor.status)
    app.state.watchers = set[asyncio.Task[None]]()  # cancelled by the server on exit
    return app
