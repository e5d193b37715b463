"""One engine process: argv/env from a profile, spawn, pass its output through, stop its whole tree.

This module never decides policy (when to restart, what counts as wedged):
that is the supervisor's. It only knows how to run one vLLM server and how to
make sure that, once stopped, nothing of it is left.
"""

from __future__ import annotations

import asyncio
import collections
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import structlog

from .api_access import read_api_key
from .config import Settings
from .exit_reason import describe_exit, exception_line
from . import flashinfer_cache as fi_cache
from .headless import JOIN_RE, LAUNCHER
from .logs import ENGINE_LOGGER, engine_noise, vllm_line_level
from .memory import ProcMemorySource
from .profiles import Profile
from .startup import CacheCensus, StartupRecord, absent_phases

log = structlog.get_logger("gptoss_spark.service.engine")
engine_log = structlog.get_logger(ENGINE_LOGGER)
# The supervisor's own probes (probes.py) hit these every few seconds: kept out of the engine's access log.
PROBE_PATHS = ("/health", "/metrics")

# Variables that belong to the supervisor alone: a child that inherited
# NOTIFY_SOCKET could tell systemd READY=1 on our behalf.
_SUPERVISOR_ONLY_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES")


def engine_shutdown_timeout(settings: Settings) -> int:
    """vLLM's own --shutdown-timeout: it must finish before our SIGKILL at shutdown_grace.

    vLLM's default (0) can hang forever on SIGTERM with a request in flight
    (docs/TESTING.md), so it is always set, and always below our grace.
    """
    return max(1, math.floor(settings.timeouts.shutdown_grace / 2))


def build_argv(settings: Settings, profile: Profile) -> list[str]:
    python = settings.engine.python or sys.executable
    cluster = settings.cluster
    if cluster is not None and cluster.role == "worker":
        # Rank 1 of the two-node engine: no API server (headless.py says why not api_server).
        entry = ["-c", LAUNCHER]
        listen: list[str] = []
    else:
        entry = ["-m", "vllm.entrypoints.openai.api_server"]
        listen = ["--host", settings.engine.host, "--port", str(settings.engine.port),
                  "--disable-access-log-for-endpoints", ",".join(PROBE_PATHS)]
    argv = [
        python, *entry,
        "--model", str(settings.model.dir),
        "--served-model-name", settings.model.served_name,
        *listen,
        "--shutdown-timeout", str(engine_shutdown_timeout(settings)),
        *profile.engine_args(settings),
        *cluster_args(settings),
    ]
    if settings.engine.cpu_affinity:
        argv = ["taskset", "-c", ",".join(map(str, settings.engine.cpu_affinity)), *argv]
    return argv


def cluster_args(settings: Settings) -> list[str]:
    """This node's share of a two-node engine: vLLM's own multi-node mp executor (docs/CLUSTER.md)."""
    c = settings.cluster
    if c is None:
        return []
    rank = 0 if c.role == "head" else 1
    return ["--nnodes", "2", "--node-rank", str(rank), "--master-addr", c.master_addr,
            "--master-port", str(c.master_port), *(["--headless"] if rank else [])]


def cluster_env(settings: Settings) -> dict[str, str]:
    """Which interface and address vLLM's ranks talk over: Gloo and NCCL bind to the link's interface;
    VLLM_HOST_IP is the address the head's executor publishes its message queue on (else vLLM picks the
    interface of the default route, which is not the cluster link)."""
    c = settings.cluster
    if c is None:
        return {}
    return {"GLOO_SOCKET_IFNAME": c.interface, "NCCL_SOCKET_IFNAME": c.interface, "VLLM_HOST_IP": str(c.address)}


def build_env(settings: Settings, profile: Profile, tmpdir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    for k in _SUPERVISOR_ONLY_ENV:
        env.pop(k, None)
    env.update(settings.cache_env())
    env.update(flashinfer_env(settings, profile, env))
    env.update({
        "TMPDIR": str(tmpdir),
        "PYTHONUNBUFFERED": "1",
        # A host service phones nobody home, and a start never waits on the network: the checkpoint
        # is local (HF_HUB_OFFLINE makes huggingface_hub answer from disk or fail at once).
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
    })
    if settings.model.tiktoken_dir is not None:
        env["TIKTOKEN_ENCODINGS_BASE"] = str(settings.model.tiktoken_dir)
    env.update(cluster_env(settings))
    key = read_api_key(settings)
    if key:
        # Through the environment, not argv: argv is world-readable in /proc.
        env["VLLM_API_KEY"] = key
    env.update(profile.engine_env(settings))
    return env


def flashinfer_env(settings: Settings, profile: Profile, environ: dict[str, str]) -> dict[str, str]:
    """CUDA_HOME, ninja on PATH, the keyed FlashInfer workspace and a bounded MAX_JOBS (flashinfer_cache.py).

    The key is the supervisor's own venv's FlashInfer (the engine runs from the same
    venv); without FlashInfer (the CPU build) the workspace stays cache_env()'s.
    """
    try:
        key: fi_cache.CacheKey | None = fi_cache.current_key(environ)
    except fi_cache.NoCacheKey:
        key = None
    python_bin = Path(settings.engine.python or sys.executable).parent
    return fi_cache.engine_env(settings.cache_dir / "flashinfer", key, python_bin, environ,
                               available_bytes=ProcMemorySource().read().available_bytes,
                               cores=fi_cache.cores(), profile_memory_gib=profile.memory_gib)


def session_members(sid: int) -> list[int]:
    """Live (non-zombie) processes whose session id is sid: the engine and every child it made."""
    return [pid for pid, _ in _session_states(sid)]


def stopped_members(sid: int) -> list[int]:
    """Members of session sid stopped by a signal (SIGSTOP, SIGTSTP: state T) or a tracer (t).

    SIGTERM stays pending at a stopped process: it cannot shut down, so waiting a grace for it is waste."""
    return [pid for pid, state in _session_states(sid) if state in ("T", "t")]


def _session_states(sid: int) -> list[tuple[int, str]]:
    """(pid, state letter of /proc/PID/stat) of the live (non-zombie) members of session sid."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # Fields after the ")" of comm: state ppid pgrp session ...
        rest = stat[stat.rfind(b")") + 2:].split()
        if rest[0] == b"Z":
            continue
        if int(rest[3]) == sid:
            members.append((int(entry), rest[0].decode()))
    return members


class EngineProcess:
    """A vLLM OpenAI server in its own session (so its whole tree can be signalled and found)."""

    def __init__(self, settings: Settings, profile: Profile, *, argv: list[str] | None = None,
                 env: dict[str, str] | None = None, tail_lines: int = 40):
        self.settings = settings
        self.profile = profile
        self._argv = argv
        self._env = env
        self.proc: asyncio.subprocess.Process | None = None
        self.tmpdir: Path | None = None
        self.started_at: float | None = None
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        # Exception lines of the whole output: the EngineCore's cause can be further back than the
        # tail holds, behind the API server's own traceback (exit_reason.root_cause).
        self.exceptions: collections.deque[str] = collections.deque(maxlen=20)
        # Set when vLLM logs that this rank joined the engine's distributed groups (headless.py).
        self.joined_at: float | None = None
        # Where this start's time goes and what it compiled (startup.py); the supervisor adds the
        # milestones only it sees and the cache entries the start added.
        self.startup = StartupRecord(profile.name)
        self.census = CacheCensus(self.cache_dirs(settings))
        self.census_before: dict[str, set[str]] = {}
        self._pump: asyncio.Task[None] | None = None
        # Set by stop(): what the engine logs from then on is the shutdown we asked for (its
        # EngineDeadError traceback, nanobind's leak report), not an error of the service.
        self.stop_requested = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def base_url(self) -> str:
        host = self.settings.engine.host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return f"http://{host}:{self.settings.engine.port}"

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc else None

    async def start(self) -> None:
        run_dir = self.settings.run_dir
        # Short name: vLLM puts zmq IPC sockets (a 36-char uuid) in TMPDIR, and a socket path
        # has at most 107 bytes (sun_path).
        self.tmpdir = Path(tempfile.mkdtemp(prefix="gptoss-spark-engine-", dir=run_dir))
        for d in self.settings.cache_env().values():
            Path(d).mkdir(parents=True, exist_ok=True)
        self.census_before = await asyncio.to_thread(self.census.snapshot)
        argv = self._argv or build_argv(self.settings, self.profile)
        env = self._env if self._env is not None else build_env(self.settings, self.profile, self.tmpdir)
        env = {**env, "TMPDIR": str(self.tmpdir)}
        self.proc = await asyncio.create_subprocess_exec(
            *argv, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # own session + process group: the unit of stop
        )
        self.started_at = time.monotonic()
        self.startup = StartupRecord(self.profile.name, spawned_at=self.started_at, absent=absent_phases(argv))
        self._pump = asyncio.create_task(self._pass_output(), name=f"engine-output-{self.proc.pid}")
        log.info("engine spawned", pid=self.proc.pid, profile=self.profile.name, argv=" ".join(argv))

    async def _pass_output(self) -> None:
        assert self.proc and self.proc.stdout
        pid = self.proc.pid
        level = "info"
        while True:
            raw = await self.proc.stdout.readline()
            if not raw:
                return
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                if self.joined_at is None and JOIN_RE.search(line):
                    self.joined_at = time.monotonic()
                self.startup.feed(line)
                if engine_noise(line):  # vLLM's route listing, nanobind's exit report (logs.py)
                    engine_log.debug(line, pid=pid, profile=self.profile.name)
                    continue
                self.tail.append(line)
                if exception_line(line):
                    self.exceptions.append(line)
                level = vllm_line_level(line, level)  # an engine WARNING is a warning in the journal too
                shown = level
                if self.stop_requested and level in ("error", "critical"):
                    shown = "info"  # the engine's complaint about the stop we asked for
                getattr(engine_log, shown)(line, pid=pid, profile=self.profile.name)

    @staticmethod
    def cache_dirs(settings: Settings) -> dict[str, Path]:
        env = settings.cache_env()
        return {"triton": Path(env["TRITON_CACHE_DIR"]), "vllm": Path(env["VLLM_CACHE_ROOT"]),
                "flashinfer": Path(env["FLASHINFER_WORKSPACE_BASE"]),
                "cute-dsl": Path(env["GPTOSS_SPARK_CUTE_DSL_CACHE"])}

    async def count_cache_additions(self) -> None:
        """Once ready: which kernel caches this start added to (it compiled what they now hold)."""
        after = await asyncio.to_thread(self.census.snapshot)
        self.startup.cache_added = CacheCensus.added(self.census_before, after)

    async def exited(self) -> int:
        """Return once the main process has exited, its output perhaps not yet all read.

        Not proc.wait(): in CPython 3.11 that also waits for the stdout pipe to close, and an
        orphaned vLLM EngineCore child keeps it open, so a kill -9 of the API server would go
        unnoticed until the health probes fail. returncode is set by the child watcher on exit;
        polled often, so the supervisor leaves `ready` well within a second of the death.
        """
        assert self.proc
        while self.proc.returncode is None:
            await asyncio.sleep(0.05)
        return self.proc.returncode

    async def output_settled(self, timeout: float = 2.0) -> None:
        """Let the last lines a dead engine wrote reach the tail (bounded: an orphaned child
        may hold the pipe open for good)."""
        if self._pump:
            try:
                await asyncio.wait_for(asyncio.shield(self._pump), timeout)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                pass

    def exit_reason(self, when: str = "") -> str:
        """Why it ended, with the telling lines of its output (exit_reason.py)."""
        assert self.proc and self.proc.returncode is not None
        return describe_exit(self.proc.returncode, self.tail, when, self.exceptions)

    async def stop(self, grace: float | None = None) -> float:
        """SIGTERM the engine's group, SIGKILL it after grace, return once no process of the tree remains.

        Returns the seconds it took. Raises RuntimeError if processes survive SIGKILL (stuck in D state).
        """
        if self.proc is None:
            return 0.0
        grace = self.settings.timeouts.shutdown_grace if grace is None else grace
        t0 = time.monotonic()
        sid = self.proc.pid
        self.stop_requested = True
        if self.proc.returncode is None and (stopped := stopped_members(sid)):
            # A wedged (SIGSTOPped) engine: a SIGTERM would wait, pending, for the whole grace.
            log.warning("engine processes are stopped (SIGSTOP), killing them without the grace",
                        pid=sid, stopped=" ".join(map(str, stopped)))
        elif self.proc.returncode is None:
            self._signal_group(sid, signal.SIGTERM)
            try:
                await asyncio.wait_for(self.exited(), grace)
            except asyncio.TimeoutError:
                log.warning("engine ignored SIGTERM, killing its process group", pid=sid, grace=grace)
        # The main process may be gone while children it forked live on: always sweep the session.
        await self._kill_session(sid)
        await self.exited()
        if self._pump:
            self._pump.cancel()
        self._cleanup_tmpdir()
        took = time.monotonic() - t0
        log.info("engine stopped", pid=sid, rc=self.proc.returncode, seconds=round(took, 2))
        return took

    @staticmethod
    def _signal_group(pgid: int, sig: int) -> None:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass

    async def _kill_session(self, sid: int, deadline: float = 10.0) -> None:
        t_end = time.monotonic() + deadline
        while True:
            members = session_members(sid)
            if not members:
                return
            self._signal_group(sid, signal.SIGKILL)
            for pid in members:  # members that moved to another process group
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > t_end:
                raise RuntimeError(f"engine processes survive SIGKILL: {members}")
            await asyncio.sleep(0.05)

    def _cleanup_tmpdir(self) -> None:
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
