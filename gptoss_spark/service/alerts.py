"""Optional alerts: one JSON document per event the operator should hear about at once.

Events: `gave_up` (the supervisor stopped retrying: state failed), `memory_guard` (the
engine was stopped before the host froze), `wedged` (a wedged engine was restarted), and
once per throttle episode (throttle.py) `gpu_thermal`, `gpu_power`, `gpu_hw_slowdown`,
`gpu_clock_low` (the kinds in gpu.alerts).
The document: {"event", "state", "profile", "reason", "host", "time"}, and for the GPU events
"figures" (temperature, clocks, power, throttle reasons); it is POSTed to alerts.webhook_url
and/or given on stdin to alerts.command.

Sending never blocks the supervisor: each send is its own task, bounded by
alerts.timeout (a command still running then is killed); a failure to send is logged,
never raised. On exit the supervisor waits for sends in flight, bounded the same way.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import structlog

from .alert_kinds import AlertEvent
from .config import AlertSettings

log = structlog.get_logger("gptoss_spark.service.alerts")



class Alerter:
    def __init__(self, settings: AlertSettings):
        self.settings = settings
        self._tasks: set[asyncio.Task[None]] = set()
        self.sent = 0
        self.failed = 0

    @property
    def enabled(self) -> bool:
        return bool(self.settings.webhook_url or self.settings.command)

    def document(self, event: str, state: str, profile: str | None, reason: str,
                 figures: dict[str, object] | None = None) -> dict[str, object]:
        doc: dict[str, object] = {"event": event, "state": state, "profile": profile, "reason": reason,
                                  "host": socket.gethostname(), "time": time.time()}
        if figures is not None:
            doc["figures"] = figures
        return doc

    def notify(self, event: str, state: str, profile: str | None, reason: str,
               figures: dict[str, object] | None = None) -> None:
        """Queue the alert and return at once (called from the supervisor's loop)."""
        event = AlertEvent(event)  # a ValueError for a word outside the vocabulary
        if not self.enabled:
            return
        body = json.dumps(self.document(event, state, profile, reason, figures)).encode()
        if self.settings.webhook_url:
            self._spawn(self._post(body, event), f"alert-webhook-{event}")
        if self.settings.command:
            self._spawn(self._run(body, event), f"alert-command-{event}")

    def _spawn(self, coro, name: str) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a state change outside the supervisor's run): nothing can send
            coro.close()
            log.warning("alert not sent: no event loop", task=name)
            return
        task = loop.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post(self, body: bytes, event: str) -> None:
        url = self.settings.webhook_url
        try:
            async with httpx.AsyncClient(timeout=self.settings.timeout) as client:
                r = await asyncio.wait_for(
                    client.post(url, content=body, headers={"Content-Type": "application/json"}),
                    self.settings.timeout)
            if r.status_code >= 300:
                raise RuntimeError(f"HTTP {r.status_code}")
        except Exception as e:  # a failed alert must never take the supervisor down
            self.failed += 1
            log.warning("alert not delivered", alert=event, via="webhook", url=url,
                        error=f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
            return
        self.sent += 1
        log.info("alert sent", alert=event, via="webhook", url=url)

    async def _run(self, body: bytes, event: str) -> None:
        argv = self.settings.command
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE, start_new_session=True)
        except OSError as e:
            self.failed += 1
            log.warning("alert not delivered", alert=event, via="command", command=argv[0], error=str(e))
            return
        try:
            _, err = await asyncio.wait_for(proc.communicate(body), self.settings.timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            self.failed += 1
            log.warning("alert not delivered", alert=event, via="command", command=argv[0],
                        error=f"still running after {self.settings.timeout:g} s, killed")
            return
        if proc.returncode != 0:
            self.failed += 1
            last = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
            log.warning("alert not delivered", alert=event, via="command", command=argv[0],
                        error=f"exit status {proc.returncode}", stderr=last[0][:200])
            return
        self.sent += 1
        log.info("alert sent", alert=event, via="command", command=argv[0])

    async def drain(self) -> None:
        """Let sends in flight finish (each is bounded by the timeout): called once, on exit."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self.settings.timeout + 1)
