"""run_admin_server: serves in the caller's loop, leaves signals alone, survives a taken port, ends on cancel."""

from __future__ import annotations

import asyncio
import signal
import socket
from pathlib import Path

import httpx
import pytest
from structlog.testing import capture_logs

from gptoss_spark.admin import server as admin_server
from gptoss_spark.service.config import Settings
from gptoss_spark.service.memory import GIB, MemoryReading
from gptoss_spark.service.supervisor import Supervisor


class PlentyOfMemory:
    def read(self) -> MemoryReading:
        return MemoryReading(available_bytes=100 * GIB, total_bytes=128 * GIB, psi_some_avg10=None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "demo.toml").write_text('description = "the demo"\n')
    return Settings.model_validate({
        "default_profile": "demo", "model": {"dir": str(model)},
        "admin": {"port": free_port(), "token_file": str(tmp_path / "missing.token")},
        "paths": {"state_dir": str(tmp_path / "state"), "profile_dirs": [str(profiles)]},
    })


async def wait_until_answers(url: str, seconds: float = 20.0) -> httpx.Response:
    deadline = asyncio.get_running_loop().time() + seconds
    async with httpx.AsyncClient(timeout=2) as c:
        while True:
            try:
                return await c.get(url)
            except httpx.TransportError:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.05)


def test_serves_in_the_callers_loop_without_touching_signal_handlers(settings):
    def on_term(signum, frame):  # a stand-in for the supervisor's own handler
        pass

    async def main():
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, lambda: None)
        before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        sup = Supervisor(settings, memory_source=PlentyOfMemory())
        task = asyncio.create_task(admin_server.run_admin_server(sup, settings))
        r = await wait_until_answers(f"http://127.0.0.1:{settings.admin.port}/admin/health")
        during = {s: signal.getsignal(s) for s in before}
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        after = {s: signal.getsignal(s) for s in before}
        # The port is released: it can be bound again at once.
        admin_server.bind_socket(settings.admin).close()
        loop.remove_signal_handler(signal.SIGHUP)
        return r, before, during, after

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        r, before, during, after = asyncio.run(main())
    finally:
        signal.signal(signal.SIGTERM, old)
    assert r.status_code == 503 and r.json()["state"] == "stopped"
    assert before[signal.SIGTERM] is on_term
    assert during == before and after == before


def test_a_taken_port_logs_one_error_keeps_running_and_binds_once_free(settings, monkeypatch):
    monkeypatch.setattr(admin_server, "BIND_RETRY_INITIAL", 0.05)
    monkeypatch.setattr(admin_server, "BIND_RETRY_MAX", 0.05)
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", settings.admin.port))
    squatter.listen(1)

    async def main():
        sup = Supervisor(settings, memory_source=PlentyOfMemory())
        with capture_logs() as logs:
            task = asyncio.create_task(admin_server.run_admin_server(sup, settings))
            for _ in range(20):  # many retry periods while the port stays taken
                await asyncio.sleep(0.05)
            still_running = not task.done()
            squatter.close()
            r = await wait_until_answers(f"http://127.0.0.1:{settings.admin.port}/admin/health")
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return still_running, r, logs

    try:
        still_running, r, logs = asyncio.run(main())
    finally:
        squatter.close()
    errors = [e for e in logs if e["log_level"] == "error"]
    assert still_running
    assert len(errors) == 1 and "already in use" in errors[0]["event"]
    assert "engine keeps serving" in errors[0]["event"]
    assert any(e["event"] == "admin API port is free again" for e in logs)
    assert r.status_code == 503

