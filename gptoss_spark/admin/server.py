"""Serve the admin app with uvicorn inside the supervisor's event loop.

Two things uvicorn would do that a supervisor cannot allow:
- Server.serve() captures SIGINT/SIGTERM for itself; the supervisor owns
  SIGTERM/SIGHUP (drain, stop the engine, tell systemd). capture_signals is
  overridden to do nothing, and this task simply ends when cancelled.
- A port it cannot bind ends in sys.exit(), which would unwind the whole
  event loop and take the engine down. The socket is bound here instead: if
  the port is taken, one clear error is logged, the supervisor and engine keep
  serving, and the bind is retried quietly until it succeeds (then logged).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
from typing import TYPE_CHECKING, Iterator

import structlog
import uvicorn

from ..service.config import AdminSettings, Settings
from .app import create_app

if TYPE_CHECKING:
    from ..service.supervisor import Supervisor

log = structlog.get_logger("gptoss_spark.admin")

BIND_RETRY_INITIAL = 5.0
BIND_RETRY_MAX = 60.0
SHUTDOWN_GRACE = 3.0


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The supervisor installed its own handlers; leave them alone.
        yield


def bind_socket(admin: AdminSettings) -> socket.socket:
    """A listening TCP socket for admin.host:admin.port (OSError if it cannot be had)."""
    host = admin.host
    infos = socket.getaddrinfo(host or None, admin.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, socktype, proto, _, addr = infos[0]
    sock = socket.socket(family, socktype, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(addr)
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _bind_problem(admin: AdminSettings, e: OSError) -> str:
    where = f"{admin.host}:{admin.port}"
    if e.errno == errno.EADDRINUSE:
        why = f"port {admin.port} is already in use (find it: ss -ltnp 'sport = :{admin.port}')"
    elif e.errno == errno.EACCES:
        why = f"permission denied for port {admin.port}"
    elif e.errno == errno.EADDRNOTAVAIL or isinstance(e, socket.gaierror):
        why = f"address {admin.host!r} is not on this host"
    else:
        why = e.strerror or str(e)
    return (f"admin API cannot listen on {where}: {why}; the engine keeps serving, the admin API is "
            f"down until the address is free (retrying), or set [admin] port in the settings and restart")


async def _bind_with_retry(admin: AdminSettings) -> socket.socket:
    delay = BIND_RETRY_INITIAL
    failed = False
    while True:
        try:
            sock = bind_socket(admin)
        except OSError as e:
            if not failed:
                log.error(_bind_problem(admin, e))
                failed = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, BIND_RETRY_MAX)
            continue
        if failed:
            log.info("admin API port is free again", host=admin.host, port=admin.port)
        return sock


async def run_admin_server(supervisor: "Supervisor", settings: Settings) -> None:
    """Serve the admin API until cancelled. Never installs signal handlers; never exits the process."""
    app = create_app(supervisor, settings)
    sock = await _bind_with_retry(settings.admin)
    config = uvicorn.Config(
        app,
        lifespan="off",            # nothing to start; and a failing lifespan would sys.exit()
        log_config=None,           # leave logging to structlog; uvicorn's own warnings still reach stderr
        access_log=False,          # mutations are logged by the app (peer, what, outcome), reads are not
        server_header=False,
        timeout_graceful_shutdown=int(SHUTDOWN_GRACE),
        limit_concurrency=256,     # 503 beyond this instead of unbounded memory
        ws="none",
        timeout_keep_alive=5,
    )
    server = _Server(config)
    bound = sock.getsockname()
    log.info("admin API listening", host=bound[0], port=bound[1])
    serving = asyncio.create_task(server.serve(sockets=[sock]), name="admin-uvicorn")
    try:
        await asyncio.shield(serving)
    except asyncio.CancelledError:
        server.should_exit = True
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
            await asyncio.wait_for(serving, SHUTDOWN_GRACE + 2)
        raise
    finally:
        sock.close()
        for task in list(app.state.watchers):
            task.cancel()
