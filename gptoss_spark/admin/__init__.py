"""The admin API on :8101: a thin FastAPI layer over the Supervisor.

It parses, authorizes, calls the supervisor and maps its outcomes to HTTP; it
never touches processes. Served by uvicorn inside the supervisor's own event
loop (server.py), without taking over the supervisor's signals.
"""

from .app import create_app
from .server import run_admin_server

__all__ = ["create_app", "run_admin_server"]
