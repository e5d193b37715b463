"""`gptoss-spark serve` run by a benchmark: started as the unit starts it, waited on through the admin
API, its start record read back, stopped with SIGTERM. Shared by the start-time and GPU engine runs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    def __init__(self, cfg: Path, admin: int, token: str, log: Path, python: str = sys.executable):
        self.cfg, self.token, self.log, self.python = cfg, token, log, python
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{admin}", timeout=30)
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 1800) -> float:
        t0 = time.monotonic()
        self.proc = subprocess.Popen([self.python, "-m", "gptoss_spark.cli", "serve", "--config", str(self.cfg)],
                                     stdout=self.log.open("a"), stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.wait_ready(timeout)
        return time.monotonic() - t0

    def wait_ready(self, timeout: float = 1800) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise SystemExit(f"serve exited {self.proc.returncode}; see {self.log}")
            try:
                if self.client.get("/admin/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise SystemExit(f"not ready in {timeout} s; see {self.log}")

    def reload(self) -> float:
        t0 = time.monotonic()
        op = self.client.post("/admin/restart", headers={"Authorization": f"Bearer {self.token}"}).json()
        while op["status"] in ("pending", "running"):
            time.sleep(0.2)
            op = self.client.get(op["poll"]).json()
        if op["status"] != "succeeded":
            raise SystemExit(f"reload failed: {op}")
        return time.monotonic() - t0

    def status(self) -> dict:
        return self.client.get("/admin/status").json()

    def last_start(self) -> dict:
        return self.status()["start"]["last"]

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)
