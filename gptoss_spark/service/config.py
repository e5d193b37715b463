"""Service settings: the settings file (defaults.DEFAULT_CONFIG_PATH) -> validated, typed objects.

One source of truth for ports, paths, timeouts and policies (the default addresses and the
settings path are base/defaults.py's, which the stdlib-only installer reads too). Profiles (what the
engine runs) live in profiles.py; this module only says where to find them.
Every error a user can cause ends in a ConfigError naming file, key and fix.
"""

from __future__ import annotations

import os
import tempfile
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, IPvAnyAddress, ValidationError, model_validator

from ..base.errors import ConfigError
from ..base.defaults import ADMIN_PORT, CLAIMS_DIR, CONFIG_ENV_VAR, DEFAULT_CONFIG_PATH, ENGINE_PORT, LOOPBACK, STATE_DIR
from ..base.net import is_loopback
from .alert_kinds import GpuAlertKind


class _Section(BaseModel):
    # Unknown keys are typos until proven otherwise: reject them.
    model_config = ConfigDict(extra="forbid", frozen=True)


EAGLE3_20B_DIR_NAME = "gpt-oss-20b-Eagle3"  # models/catalog.py's dir_name for gpt-oss-20b-eagle3


class ModelSettings(_Section):
    dir: Path = Path("/srv/models/gpt-oss-120b")
    served_name: str = Field("gptoss", pattern=r"^[A-Za-z0-9._-]{1,64}$")
    # Eagle3 draft head for the spec profile ({eagle3_dir} in profiles).
    eagle3_dir: Path = Path("/srv/models/gpt-oss-120b-Eagle3")
    # The gpt-oss-20b head, for spec-20b ({eagle3_20b_dir}): another model's head, so its own key.
    # Left out (a settings file from before the key): gpt-oss-20b-Eagle3 beside eagle3_dir, where
    # `model pull gpt-oss-20b-eagle3` has always put it.
    eagle3_20b_dir: Path = None  # type: ignore[assignment]  # filled in by _head_beside
    # Directory holding o200k_base.tiktoken, so the engine never downloads it.
    tiktoken_dir: Path | None = None

    @model_validator(mode="before")
    @classmethod
    def _head_beside(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("eagle3_20b_dir") is None:
            eagle3 = Path(data.get("eagle3_dir") or cls.model_fields["eagle3_dir"].default)
            data = {**data, "eagle3_20b_dir": eagle3.parent / EAGLE3_20B_DIR_NAME}
        return data


class EngineSettings(_Section):
    # Loopback by default: vLLM's OpenAI API has no auth unless api_key_file is set,
    # and any other address requires it (api_access.py).
    host: str = LOOPBACK
    port: int = Field(ENGINE_PORT, ge=1, le=65535)
    # Interpreter that runs vLLM; empty = the one running the supervisor (same venv).
    python: str = ""
    # File holding the key clients must send on /v1 (vLLM --api-key); none = open.
    api_key_file: Path | None = None
    # Pin the engine to these CPUs (tests, shared hosts); empty = no pinning.
    cpu_affinity: list[int] = []


class AdminSettings(_Section):
    host: str = LOOPBACK
    port: int = Field(ADMIN_PORT, ge=1, le=65535)
    token_file: Path = Path("/etc/gptoss-spark/admin.token")


class PathSettings(_Section):
    state_dir: Path = STATE_DIR
    # Profile directories, read in order; a later file with the same name wins.
    # profiles/ holds the shipped ones (installed once, then yours to edit),
    # profiles.d/ your own.
    profile_dirs: list[Path] = [Path("/etc/gptoss-spark/profiles"), Path("/etc/gptoss-spark/profiles.d")]


class TimeoutSettings(_Section):
    # Seconds. load: engine start to /health 200 (first start on a Spark: minutes).
    load: float = Field(1800.0, gt=0)
    canary: float = Field(60.0, gt=0)
    # Bounded wait for running requests before stop (SIGTERM, profile switch).
    drain: float = Field(30.0, ge=0)
    # After SIGTERM to the engine, how long before SIGKILL of its process group.
    shutdown_grace: float = Field(15.0, gt=0)
    # Health probe cadence while ready, and how long one probe may take.
    probe_interval: float = Field(5.0, gt=0)
    probe_timeout: float = Field(5.0, gt=0)


class RestartSettings(_Section):
    backoff_initial: float = Field(2.0, gt=0)
    backoff_max: float = Field(60.0, gt=0)
    # Give up (state failed) after this many crashes within window seconds.
    max_crashes: int = Field(5, ge=1)
    window: float = Field(600.0, gt=0)
    # What giving up means: "stay" keeps the supervisor (and admin API) up in
    # state failed so a human or a profile change can recover; "exit" exits
    # non-zero and leaves it to systemd's Restart= policy.
    on_give_up: Literal["stay", "exit"] = "stay"


class WedgeSettings(_Section):
    # Idle canary every this many seconds while ready (0 = off).
    canary_interval: float = Field(60.0, ge=0)
    # Requests running but vllm:generation_tokens_total unchanged this long = wedged.
    stall_seconds: float = Field(120.0, gt=0)


class MemorySettings(_Section):
    # Unified memory: running out freezes the host instead of an OOM kill.
    # Refuse to start unless MemAvailable >= the profile's memory_gib + this.
    start_floor_gib: float = Field(4.0, ge=0)
    # While running: stop the engine if MemAvailable drops below this ...
    danger_available_gib: float = Field(2.0, ge=0)
    # ... or the memory PSI "some avg10" exceeds this percentage.
    danger_psi_some_avg10: float = Field(40.0, gt=0, le=100)
    check_interval: float = Field(1.0, gt=0)
    # A start the guard refuses waits for the memory (re-checked every check_interval): after the
    # service has served, as long as it takes; a first start gives up after this many seconds (exit 3).
    start_wait: float = Field(60.0, ge=0)
    # Several services on one host (two models): each writes its claim (profile memory_gib) here and a
    # start is refused when all claims + the floor exceed MemTotal (budget.py). Unset: the directory
    # Settings.claims_dir derives from the state dir, one for every installed service.
    claims_dir: Path | None = None


class AlertSettings(_Section):
    # POST one JSON document per event here (http or https); empty = none.
    webhook_url: str = Field("", pattern=r"^(https?://\S+)?$")
    # Run this argv with the JSON document on stdin; empty = none.
    command: list[str] = []
    # Seconds a webhook or command may take before it is abandoned (and that is logged).
    timeout: float = Field(10.0, gt=0, le=300)


class GpuSettings(_Section):
    """GPU and memory telemetry (service/telemetry.py), throttle alerts, and the optional clock cap."""

    # Seconds between telemetry samples (NVML, memory figures, the engine's /metrics for the page).
    sample_interval: float = Field(5.0, ge=1, le=300)
    # A throttle (thermal, power, hardware slowdown) or a low clock must last this long to be an episode.
    alert_after_seconds: float = Field(60.0, gt=0)
    # "Well below its norm": the SM clock at or under this fraction of its norm (the cap when set,
    # else the device's maximum) while requests run.
    low_clock_fraction: float = Field(0.5, gt=0, lt=1)
    # The power cap counts as an episode only while it holds the SM clock at or under this fraction
    # of its norm: a GPU under load at its power limit is normal (an H200 under a matmul: 641 of
    # 700 W, 87% of its maximum clock). 1 = any power capping counts.
    power_clock_fraction: float = Field(0.8, gt=0, le=1)
    # The episode kinds that send an alert (docs/OPERATIONS.md, "GPU throttling"); the others are
    # still tracked and shown in status and /metrics. [] = no GPU alerts.
    alerts: list[GpuAlertKind] = list(GpuAlertKind)
    # Cap the SM clock (MHz) while the service runs, as owners do with `nvidia-smi -lgc` against
    # thermal shutdowns; applied before the engine starts, reset after it stops (docs/OPERATIONS.md,
    # "GPU clock cap"). 0 = off.
    max_clock_mhz: int = Field(0, ge=0, le=10000)


class ClusterSettings(_Section):
    """Two nodes, one engine (docs/CLUSTER.md): vLLM's multi-node mp executor, tensor parallel across both.

    The head runs rank 0 and the OpenAI API; the worker runs rank 1 headless. Each node's
    file names its own role and address and the other's address.
    """

    role: Literal["head", "worker"]
    # This node's address on the cluster link, and the other node's. vLLM's master address
    # (its TCPStore, rank 0) is always the head's.
    address: IPvAnyAddress
    peer: IPvAnyAddress
    # The cluster link's interface on this node: GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME.
    interface: str = Field(..., pattern=r"^[A-Za-z0-9_.:-]{1,15}$")
    master_port: int = Field(29501, ge=1, le=65535)
    # The peer's admin API port (the supervisors coordinate through it); 0 = the same as admin.port.
    peer_admin_port: int = Field(0, ge=0, le=65535)

    @model_validator(mode="after")
    def _two_addresses(self) -> "ClusterSettings":
        if self.address == self.peer:
            raise ValueError(f"cluster.address and cluster.peer are both {self.address}: "
                             "give this node's link address and the other node's")
        return self

    @property
    def master_addr(self) -> str:
        return str(self.address if self.role == "head" else self.peer)


class Settings(_Section):
    source: Path | None = Field(None, exclude=True)
    default_profile: str = "plain"
    model: ModelSettings = ModelSettings()
    engine: EngineSettings = EngineSettings()
    admin: AdminSettings = AdminSettings()
    paths: PathSettings = PathSettings()
    timeouts: TimeoutSettings = TimeoutSettings()
    restart: RestartSettings = RestartSettings()
    wedge: WedgeSettings = WedgeSettings()
    memory: MemorySettings = MemorySettings()
    alerts: AlertSettings = AlertSettings()
    gpu: GpuSettings = GpuSettings()
    cluster: ClusterSettings | None = None

    @model_validator(mode="after")
    def _ports_differ(self) -> "Settings":
        if self.engine.port == self.admin.port:
            raise ValueError("engine.port and admin.port must differ")
        return self

    @model_validator(mode="after")
    def _network_needs_a_key(self) -> "Settings":
        # Beyond loopback anyone on the network could use the engine: not without a key.
        if not is_loopback(self.engine.host) and self.engine.api_key_file is None:
            raise ValueError(f"engine.host {self.engine.host!r} serves the network, so engine.api_key_file is "
                             "required: set it to /etc/gptoss-spark/api.key (the installer makes it)")
        return self

    @model_validator(mode="after")
    def _cluster_reachable(self) -> "Settings":
        # The supervisors talk over the admin API: on loopback the peer could not reach it.
        c = self.cluster
        if c is not None and is_loopback(self.admin.host):
            raise ValueError(f"[cluster] is set but admin.host is {self.admin.host!r}, which the peer cannot "
                             f"reach: set admin.host to this node's link address ({c.address})")
        if c is not None and self.cluster.master_port in (self.engine.port, self.admin.port):
            raise ValueError("cluster.master_port must differ from engine.port and admin.port")
        return self

    @property
    def peer_admin_url(self) -> str | None:
        c = self.cluster
        if c is None:
            return None
        host = f"[{c.peer}]" if c.peer.version == 6 else str(c.peer)
        return f"http://{host}:{c.peer_admin_port or self.admin.port}"

    # Caches live under the state dir so a restart (and a reboot) compiles nothing. Each variable is
    # one its reader takes as given (tests/unit/test_cache_env.py finds the reader in the installed
    # source): vLLM's compile cache and FlashInfer autotune results (VLLM_CACHE_ROOT), FlashInfer's JIT
    # modules, Triton's kernels and autotune results (vLLM keeps a TRITON_CACHE_DIR it was given),
    # humming's kernels (humming-kernels, in the Spark venv), outlines' grammars (XDG_CACHE_HOME), and
    # the CuTe-DSL quantizer (ours: engine_hooks/cute_dsl_cache.py). Not set, because nothing would
    # read it: TORCHINDUCTOR_CACHE_DIR (vLLM points Inductor into VLLM_CACHE_ROOT itself, at every
    # compile) and CUTE_DSL_CACHE_DIR (cute.compile never consults the DSL's file cache).
    @property
    def cache_dir(self) -> Path:
        return self.paths.state_dir / "cache"

    def cache_env(self) -> dict[str, str]:
        c = self.cache_dir
        return {
            "VLLM_CACHE_ROOT": str(c / "vllm"),
            "FLASHINFER_WORKSPACE_BASE": str(c / "flashinfer"),
            "TRITON_CACHE_DIR": str(c / "triton"),
            "HUMMING_CACHE_DIR": str(c / "humming"),
            "XDG_CACHE_HOME": str(c / "xdg"),
            "GPTOSS_SPARK_CUTE_DSL_CACHE": str(c / "cute-dsl"),
        }

    @property
    def claims_dir(self) -> Path:
        """memory.claims_dir, or unset: CLAIMS_DIR for the installed services (the default's state dir
        is STATE_DIR, gptoss-spark@NAME's STATE_DIR/NAME), so they budget each other with no setting;
        <state_dir>/claims for a service whose state is elsewhere (a hand run, a test), which then
        counts only its own claim unless memory.claims_dir names a shared one."""
        if self.memory.claims_dir is not None:
            return self.memory.claims_dir
        state = self.paths.state_dir
        return CLAIMS_DIR if STATE_DIR in (state, state.parent) else state / "claims"

    @property
    def state_file(self) -> Path:
        return self.paths.state_dir / "state.json"

    @property
    def run_dir(self) -> Path:
        # Parent of the per-engine TMPDIRs (zmq sockets, inductor scratch), removed after each stop.
        # The temp dir (private under systemd's PrivateTmp), not the state dir: vLLM's IPC socket
        # paths must fit in 107 bytes, and a long state_dir would break them.
        return Path(tempfile.gettempdir())


def resolve_config_path(cli_path: str | os.PathLike[str] | None = None) -> Path:
    if cli_path:
        return Path(cli_path)
    env = os.environ.get(CONFIG_ENV_VAR)
    return Path(env) if env else DEFAULT_CONFIG_PATH


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """Parse a TOML file or raise a one-line ConfigError."""
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(path, None, f"{what} not found",
                          "create it (see etc/ in the source tree) or point --config / "
                          f"{CONFIG_ENV_VAR} at the right file") from None
    except PermissionError:
        raise ConfigError(path, None, f"{what} is not readable by this user",
                          "run as root or as the gptoss-spark user") from None
    except IsADirectoryError:
        raise ConfigError(path, None, f"{what} is a directory", "give the path of the .toml file") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path, None, f"not valid TOML ({e})", "fix the syntax at that line") from None
    except UnicodeDecodeError:
        raise ConfigError(path, None, "not UTF-8 text", "save the file as UTF-8") from None


def validation_to_config_error(path: Path, err: ValidationError, prefix: str = "") -> ConfigError:
    """Turn pydantic's report into one line about its first problem."""
    first = err.errors()[0]
    key = prefix + ".".join(str(p) for p in first["loc"])
    kind = first["type"]
    if kind == "extra_forbidden":
        return ConfigError(path, key, "unknown key", "remove it or check its spelling (see docs/CONFIGURATION.md)")
    if kind == "missing":
        return ConfigError(path, key, "required key is missing", "add it")
    got = first.get("input")
    shown = repr(got) if not isinstance(got, (dict, list)) or len(repr(got)) < 60 else type(got).__name__
    msg = first["msg"].removeprefix("Value error, ")
    if not first["loc"]:  # a rule across keys: the message names them
        return ConfigError(path, None, msg, "correct the value")
    return ConfigError(path, key or None, f"{msg} (got {shown})", "correct the value")


def load_settings(path: Path | None = None, *, must_exist: bool = True) -> Settings:
    """Load and validate the settings file. A missing default file is only OK when must_exist=False."""
    path = path or resolve_config_path()
    if not path.exists() and not must_exist:
        return Settings()
    data = read_toml(path, "config file")
    try:
        settings = Settings.model_validate(data)
    except ValidationError as e:
        raise validation_to_config_error(path, e) from None
    return settings.model_copy(update={"source": path})
