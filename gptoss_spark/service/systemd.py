"""sd_notify: the only channel through which systemd learns our state.

Thin over sdnotify. Without NOTIFY_SOCKET (run by hand) every call is a no-op.
The socket path is taken once and removed from os.environ, so no child (the
engine) can ever inherit it and send READY=1 on our behalf.
"""

from __future__ import annotations

import os
import time
from typing import Callable

import sdnotify

# While the engine loads (or a node waits for its peer) the supervisor sends EXTEND_TIMEOUT_USEC:
# every EXTEND_EVERY_SECONDS, for EXTEND_BY_SECONDS. If it stops extending (a hung supervisor, a
# load past timeouts.load), systemd's start job times out.
EXTEND_EVERY_SECONDS = 10.0
EXTEND_BY_SECONDS = 60.0


class Notifier:
    def __init__(self, socket_path: str | None = None):
        path = socket_path if socket_path is not None else os.environ.pop("NOTIFY_SOCKET", None)
        self.enabled = bool(path)
        self._n: sdnotify.SystemdNotifier | None = None
        # RELOADING=1 sent and no READY=1 since: systemd keeps the unit (and a `systemctl reload` job)
        # in "reloading" until READY=1 comes (systemd 252 too, once ExecReload has exited).
        self.reload_open = False
        if path:
            # sdnotify 0.3.2 (locks/) takes no socket path: SystemdNotifier() reads NOTIFY_SOCKET
            # from os.environ in its constructor and keeps the connected socket. So the path goes
            # back into the environment for exactly that call. The alternatives are worse: setting
            # its `socket` attribute after the fact leans on an undocumented field, and our own
            # datagram code would replace the pinned library rather than use it. The window is
            # safe: the Notifier is built before the engine (or any thread) starts, and the
            # environment is as it was before the call when it returns.
            saved = os.environ.get("NOTIFY_SOCKET")
            os.environ["NOTIFY_SOCKET"] = path
            try:
                self._n = sdnotify.SystemdNotifier(debug=False)
            finally:
                if saved is None:
                    os.environ.pop("NOTIFY_SOCKET", None)
                else:
                    os.environ["NOTIFY_SOCKET"] = saved

    def send(self, *lines: str) -> None:
        if self._n is not None:
            self._n.notify("\n".join(lines))

    def ready(self, status: str) -> None:
        self.reload_open = False
        self.send("READY=1", f"STATUS={status}")

    def reload_over(self, status: str) -> None:
        """STATUS; and the end of systemd's "reloading" after a restart that did not get ready.

        READY=1 is sd_notify's only way to say a reload is over; STATUS says how it went. Sent
        before the restart's operation is seen to fail, so ExecReload (`gptoss-spark restart`)
        exits 1 after it and systemd fails the reload job instead of waiting TimeoutStartSec."""
        if self.reload_open:
            self.ready(status)
        else:
            self.status(status)

    def reloading(self, status: str) -> None:
        # systemd >= 253 wants MONOTONIC_USEC with RELOADING=1 (Type=notify-reload); harmless before.
        usec = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)
        self.reload_open = True
        self.send("RELOADING=1", f"MONOTONIC_USEC={usec}", f"STATUS={status}")

    def stopping(self, status: str) -> None:
        self.send("STOPPING=1", f"STATUS={status}")

    def status(self, status: str) -> None:
        self.send(f"STATUS={status}")

    def extend_timeout(self, seconds: float) -> None:
        self.send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}")

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")


class StartJobKeeper:
    """Keeps systemd's start (or reload) job alive while a start makes progress (loading, waiting
    for the cluster's other node): EXTEND_TIMEOUT_USEC at most every EXTEND_EVERY_SECONDS. A
    supervisor that hangs stops calling progress(), and systemd's TimeoutStartSec ends the job."""

    def __init__(self, notifier: "Notifier", clock: Callable[[], float]):
        self.notifier, self.clock = notifier, clock
        self.next_extend = 0.0

    def progress(self) -> None:
        now = self.clock()
        if now >= self.next_extend:
            self.notifier.extend_timeout(EXTEND_BY_SECONDS)
            self.next_extend = now + EXTEND_EVERY_SECONDS


def watchdog_interval() -> float | None:
    """Half of systemd's WatchdogSec (WATCHDOG_USEC), if it is for us; None if no watchdog."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2_000_000
    except ValueError:
        return None
