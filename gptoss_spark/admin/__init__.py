"""The admin API on admin.port: a thin FastAPI layer over the Supervisor.

It parses, authorizes, calls the supervisor and maps its outcomes to HTTP; it
never touches processes. Served by uvicorn inside the supervisor's own event
loop (server.py), without taking over the supervisor's signals.

client.py is the other end, the API's client (admin CLI, bench ab). create_app and
run_admin_server are imported lazily, so the client loads neither FastAPI nor uvicorn.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app", "run_admin_server"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .app import create_app
        return create_app
    if name == "run_admin_server":
        from .server import run_admin_server
        return run_admin_server
    raise AttributeError(name)
