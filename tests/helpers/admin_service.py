"""`gptoss-spark serve` as a subprocess with a real vLLM engine (the tiny demo model) and its admin API.

Used by the integration tests that drive the service through the admin API
(tests/integration/test_admin_real_engine.py, test_bench_ab_engine.py).
Every engine start costs tens of seconds on two cores: share one service per module.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.helpers.demo_settings import demo_settings_toml
from tests.helpers.serve_log import engine_pids, kill_serve

TOKEN = "integration-" + "c" * 40
DEMO_ARGS = ["--max-model-len", "1024", "--max-num-seqs", "4", "--kv-cache-memory-bytes", "268435456",
             "--dtype", "bfloat16", "--enforce-eager"]
START_TIMEOUT = 1200.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def profile_toml(description: str, args: list[str], required_paths: list[str] | None = None) -> str:
    text = f'description = "{description}"\nmemory_gib = 0\n[engine]\nargs = {json.dumps(args)}\n'
    if required_paths:
        text += f"[requires]\npaths = {json.dumps(required_paths)}\n"
    return text


class Service:
    def __init__(self, tmp: Path, model_dir: Path, profiles: dict[str, str]):
        """profiles: file name without .toml -> its text; "demo" is the default profile."""
        self.tmp = tmp
        self.engine_port, self.admin_port = free_port(), free_port()
        pdir = tmp / "profiles"
        pdir.mkdir()
        for name, text in profiles.items():
            (pdir / f"{name}.toml").write_text(text)
        self.token_file = tmp / "admin.token"
        self.token_file.write_text(TOKEN + "\n")
        self.token_file.chmod(0o640)
        self.state_file = tmp / "state" / "state.json"
        self.config = tmp / "gptoss-spark.toml"
        self.config.write_text(demo_settings_toml(
            model_dir=model_dir, state_dir=tmp / "state", profile_dirs=[pdir], token_file=self.token_file,
            engine_port=self.engine_port, admin_port=self.admin_port,
            restart={"max_crashes": 3, "backoff_initial": 1},
            gpu={"sample_interval": 1}))
        self.log_path = tmp / "serve.log"
        self.admin = httpx.Client(base_url=f"http://127.0.0.1:{self.admin_port}", timeout=30)
        self.auth = {"Authorization": f"Bearer {TOKEN}"}
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.log = self.log_path.open("w")
        self.proc = subprocess.Popen([sys.executable, "-m", "gptoss_spark.cli", "serve", "--config", str(self.config)],
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=self.log,
                                     stderr=subprocess.STDOUT, cwd=self.tmp)

    def engine_pids(self) -> list[int]:
        return engine_pids(self.log_path)

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text().splitlines()[-n:])

    def wait_ready(self, timeout: float = START_TIMEOUT) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"serve exited with {self.proc.returncode}:\n{self.tail()}"
            try:
                r = self.admin.get("/admin/health")
                if r.status_code == 200:
                    return r.json()
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"not ready within {timeout:g} s:\n{self.tail()}")

    def wait_op(self, op: dict, timeout: float = START_TIMEOUT) -> dict:
        deadline = time.monotonic() + timeout
        while op["status"] in ("pending", "running"):
            assert time.monotonic() < deadline, f"operation {op} did not end:\n{self.tail()}"
            time.sleep(0.5)
            op = self.admin.get(op["poll"]).json()
        return op

    def snapshot(self) -> tuple:
        """What a refused request must leave alone: profile, state file, engine pid, state."""
        status = self.admin.get("/admin/status").json()
        return status["profile"], status["state"], status["engine_pid"], self.state_file.read_bytes()


@contextmanager
def running_service(model_dir: Path, profiles: dict[str, str],
                    before_start: Callable[[Service], None] | None = None) -> Iterator[Service]:
    """A started, ready service; afterwards the serve process and every engine it started are gone.

    before_start: run with the service's settings in place, before `serve` starts (e.g. a warm-up)."""
    # A short path: vLLM's zmq IPC sockets live in the engine's TMPDIR (state_dir/run/engine-*/<uuid>)
    # and an AF_UNIX path may not exceed 107 bytes; pytest's tmp dirs are too deep for that.
    tmp = Path(tempfile.mkdtemp(prefix="gsa-", dir="/tmp"))
    svc = Service(tmp, model_dir, profiles)
    try:
        if before_start is not None:
            before_start(svc)
        svc.start()
        svc.wait_ready()
        yield svc
    finally:
        kill_serve(svc.proc, svc.log_path)
        svc.admin.close()
        shutil.rmtree(tmp, ignore_errors=True)


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
