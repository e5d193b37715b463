"""Profiles: what the engine runs. One TOML file per profile, named by its file.

    description = "one line shown by the admin API"
    model = "gpt-oss-120b"                # the checkpoint it is for (gptoss_spark/models/catalog.py); none = any
    memory_gib = 85                       # expected peak use; the memory guard checks it
    cuda_graph_sizes = "auto"             # or batch sizes; written as --cudagraph-capture-sizes
    speculation_max_batch = 16            # with --speculative-config: K = 0 above 16 requests a step
    [engine]
    args = ["--max-num-seqs", "32"]       # vLLM arguments, beyond the ones we own
    env = { VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8 = "1" }
    [requires]
    paths = ["{eagle3_dir}/config.json"]  # must exist before any start
    gpu = true                            # needs an NVIDIA GPU (the Spark profiles)
    cluster = true                        # runs across the two nodes of [cluster] (docs/CLUSTER.md)

The last two are service/batch_shape.py's (docs/CONFIGURATION.md).

A profile may extend another (`extends = "plain"`): it then starts from that
profile's model, args, env, memory_gib, required paths, gpu requirement and the two above. Its own args replace the
base's option of the same flag (in the base's place) or are added after them,
`engine.remove_args` drops base options by flag, its env is merged over the
base's, its paths are added. Each fact is then written once (fast = plain +
our kernels). The base is looked up by name among all loaded profiles, so a
base overridden in a later directory is the one extended. Bases may extend
further; unknown bases and cycles are errors.

Placeholders {model_dir}, {eagle3_dir}, {eagle3_20b_dir} and {served_name} are filled from the
settings in args, env values and required paths: a profile names each fact once.
Any other {lowercase_word} is an error (a typo); JSON braces are left alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from . import batch_shape
from .config import Settings, read_toml, validation_to_config_error
from ..base.errors import ConfigError, RequirementError

PROFILE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
# A token that starts an option (--flag, --flag=value, -x); "-1" is a value.
_OPTION_RE = re.compile(r"^--?[A-Za-z]")
PLACEHOLDERS = ("model_dir", "eagle3_dir", "eagle3_20b_dir", "served_name")
_PLACEHOLDER_RE = re.compile(r"\{([a-z_][a-z0-9_]*)\}")

# Arguments the supervisor sets from the settings; a profile may not set them,
# or the engine would listen somewhere the probes do not look.
RESERVED_ARGS = {
    "--model": "model.dir", "--served-model-name": "model.served_name",
    "--host": "engine.host", "--port": "engine.port",
    "--shutdown-timeout": "timeouts.shutdown_grace", "--api-key": "engine.api_key_file",
    # Two nodes: each node's share of the engine comes from [cluster] (docs/CLUSTER.md).
    "--nnodes": "cluster (a profile with requires.cluster = true)", "--node-rank": "cluster.role",
    "--master-addr": "cluster.address / cluster.peer", "--master-port": "cluster.master_port",
    "--headless": "cluster.role",
}


class _ProfileEngine(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    args: list[str] = []
    env: dict[str, str] = {}
    remove_args: list[str] = []

    @field_validator("remove_args")
    @classmethod
    def _flags_only(cls, flags: list[str]) -> list[str]:
        for f in flags:
            if not _OPTION_RE.match(f) or "=" in f:
                raise ValueError(f"{f!r} is not a flag; list flags only, like \"--moe-backend\" (its value goes too)")
        return flags

    @field_validator("args")
    @classmethod
    def _no_reserved(cls, args: list[str]) -> list[str]:
        for a in args:
            flag = a.split("=", 1)[0]
            if flag in RESERVED_ARGS:
                raise ValueError(f"{flag} is set by the service; set {RESERVED_ARGS[flag]} in gptoss-spark.toml instead")
        return args

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for k in env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                raise ValueError(f"{k!r} is not a valid environment variable name")
            if k in ("NOTIFY_SOCKET", "TMPDIR"):
                raise ValueError(f"{k} is managed by the supervisor")
        return env


class _ProfileRequires(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    paths: list[str] = []
    gpu: bool | None = None  # None: the base's, or False without a base
    cluster: bool | None = None  # likewise; true = one engine across the two nodes of [cluster]


# The NVIDIA driver lists each GPU it drives here; visible inside the unit's sandbox too.
NVIDIA_GPUS_DIR = Path("/proc/driver/nvidia/gpus")


def nvidia_gpu_count() -> int:
    try:
        return sum(1 for _ in NVIDIA_GPUS_DIR.iterdir())
    except OSError:
        return 0


class _ProfileFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    extends: str | None = Field(None, pattern=PROFILE_NAME_RE.pattern)
    description: str = Field(..., min_length=1, max_length=200)
    model: str | None = None  # a catalog name; None: the base's, or any checkpoint without a base
    memory_gib: float | None = Field(None, ge=0)  # None: the base's, or 0 without a base
    # Decode-step shape (service/batch_shape.py); None: the base's, or "auto" / no limit without a base.
    cuda_graph_sizes: Literal["auto"] | list[int] | None = None
    speculation_max_batch: int | None = Field(None, ge=1)
    engine: _ProfileEngine = _ProfileEngine()

    @field_validator("cuda_graph_sizes")
    @classmethod
    def _sizes(cls, sizes):
        if isinstance(sizes, list) and (not sizes or min(sizes) < 1 or sizes != sorted(set(sizes))):
            raise ValueError("list batch sizes >= 1 in ascending order, each once, or write \"auto\"")
        return sizes
    requires: _ProfileRequires = _ProfileRequires()

    @field_validator("model")
    @classmethod
    def _known_model(cls, model: str | None) -> str | None:
        from ..models.catalog import CATALOG

        models = [c.name for c in CATALOG.values() if c.kind == "model"]
        if model is not None and model not in models:
            raise ValueError(f"unknown model {model!r}; name one of {', '.join(models)} or leave model out")
        return model


@dataclass(frozen=True)
class Profile:
    name: str
    source: Path
    description: str
    memory_gib: float
    args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    required_paths: tuple[str, ...] = ()
    needs_gpu: bool = False
    needs_cluster: bool = False
    extends: str | None = None  # the base profile's name, for information (already applied)
    cuda_graph_sizes: str | tuple[int, ...] = "auto"
    speculation_max_batch: int | None = None
    model: str | None = None  # the checkpoint it is for (a catalog name); None = any (the demo profiles)

    def checkpoint_mismatch(self, settings: Settings) -> str | None:
        """Why model.dir holds another model than this profile is for; None if it matches or cannot be told."""
        from ..models.catalog import identify

        if self.model is None:
            return None
        found = identify(settings.model.dir)
        if found is None or found.name == self.model:
            return None
        return f"is for {self.model}; {settings.model.dir} holds {found.name} ({found.layers} layers, {found.experts} experts)"

    def _fill(self, text: str, settings: Settings, key: str) -> str:
        values = {"model_dir": str(settings.model.dir), "eagle3_dir": str(settings.model.eagle3_dir),
                  "eagle3_20b_dir": str(settings.model.eagle3_20b_dir), "served_name": settings.model.served_name}

        # Only {lowercase_word} is a placeholder, so JSON values like '{"method": ...}' pass untouched.
        def sub(m: re.Match[str]) -> str:
            if m.group(1) not in values:
                raise ConfigError(self.source, key, f"unknown placeholder {m.group(0)} in {text!r}",
                                  f"use one of {', '.join('{' + p + '}' for p in PLACEHOLDERS)}")
            return values[m.group(1)]

        return _PLACEHOLDER_RE.sub(sub, text)

    def engine_args(self, settings: Settings) -> list[str]:
        """The profile's vLLM arguments as the engine gets them: placeholders filled, then the dynamic
        speculation schedule and the CUDA-graph capture sizes written in (service/batch_shape.py)."""
        args = [self._fill(a, settings, "engine.args") for a in self.args]
        if self.speculation_max_batch is not None:
            args = batch_shape.with_dynamic_speculation(args, self.speculation_max_batch)
        if not self.needs_gpu:  # CUDA graphs are a GPU profile's; a CPU engine captures none
            return args
        sizes = self.cuda_graph_sizes if isinstance(self.cuda_graph_sizes, str) else list(self.cuda_graph_sizes)
        return batch_shape.with_capture_sizes(args, sizes, self.speculation_max_batch)

    def engine_env(self, settings: Settings) -> dict[str, str]:
        return {k: self._fill(v, settings, f"engine.env.{k}") for k, v in self.env.items()}

    def missing_paths(self, settings: Settings) -> list[Path]:
        return [p for p in (Path(self._fill(raw, settings, "requires.paths")) for raw in self.required_paths)
                if not p.exists()]

    def check_requirements(self, settings: Settings) -> None:
        """Raise RequirementError (one line) if this host cannot run the profile."""
        if self.needs_gpu and nvidia_gpu_count() == 0:
            raise RequirementError(
                f"profile {self.name}: needs an NVIDIA GPU and this host has none ({NVIDIA_GPUS_DIR} lists none; "
                f"{self.source}: requires.gpu); pick a CPU profile (gptoss-spark profile lists which run here)")
        where = settings.source or "gptoss-spark.toml"
        if self.needs_cluster and settings.cluster is None:
            raise RequirementError(
                f"profile {self.name}: runs across two nodes and {where} has no [cluster] section "
                f"({self.source}: requires.cluster); pick a one-node profile or set up [cluster] (docs/CLUSTER.md)")
        if not self.needs_cluster and settings.cluster is not None:
            raise RequirementError(
                f"profile {self.name}: runs on one node and {where} sets [cluster]; pick a cluster profile "
                f"or remove [cluster] to go back to one node (docs/CLUSTER.md)")
        model_dir = settings.model.dir
        if not (model_dir / "config.json").is_file():
            raise RequirementError(
                f"profile {self.name}: no checkpoint at {model_dir} (config.json missing); "
                f"run `sudo gptoss-spark model pull {self.model or 'gpt-oss-120b'}` or set model.dir in "
                f"{settings.source or 'gptoss-spark.toml'}")
        mismatch = self.checkpoint_mismatch(settings)
        if mismatch:
            raise RequirementError(
                f"profile {self.name}: {mismatch}; pick a profile for that model (gptoss-spark profile) or set "
                f"model.dir in {settings.source or 'gptoss-spark.toml'} to a {self.model} checkpoint")
        for raw in self.required_paths:
            p = Path(self._fill(raw, settings, "requires.paths"))
            if not p.exists():
                raise RequirementError(
                    f"profile {self.name}: required path {p} does not exist ({self.source}: requires.paths); "
                    "put the file there or fix the path in the settings/profile")


@dataclass(frozen=True)
class _ProfileSource:
    """One profile file as written, before its base is applied."""

    name: str
    path: Path
    spec: _ProfileFile


def _read_profile_file(path: Path) -> _ProfileSource:
    name = path.stem
    if not PROFILE_NAME_RE.match(name):
        raise ConfigError(path, None, f"profile name {name!r} is not allowed",
                          "rename the file to lowercase letters, digits, '-' or '_' (at most 32), ending in .toml")
    data = read_toml(path, "profile file")
    try:
        spec = _ProfileFile.model_validate(data)
    except ValidationError as e:
        raise validation_to_config_error(path, e) from None
    if spec.engine.remove_args and spec.extends is None:
        raise ConfigError(path, "engine.remove_args", "only a profile that extends another can remove arguments",
                          "set extends = \"<base profile>\" or remove engine.remove_args")
    return _ProfileSource(name, path, spec)


def _own_profile(src: _ProfileSource) -> Profile:
    pf = src.spec
    return _checked(src, Profile(
        name=src.name, source=src.path, description=pf.description, memory_gib=pf.memory_gib or 0.0,
        args=tuple(pf.engine.args), env=dict(pf.engine.env), required_paths=tuple(pf.requires.paths),
        needs_gpu=bool(pf.requires.gpu), needs_cluster=bool(pf.requires.cluster),
        cuda_graph_sizes=_sizes(pf.cuda_graph_sizes) or "auto", speculation_max_batch=pf.speculation_max_batch, model=pf.model))


def _sizes(sizes: str | list[int] | None) -> str | tuple[int, ...] | None:
    return tuple(sizes) if isinstance(sizes, list) else sizes


def _checked(src: _ProfileSource, profile: Profile) -> Profile:
    """A dynamic speculation limit needs the speculation and the slot count it divides."""
    if profile.speculation_max_batch is not None:
        for flag in ("--speculative-config", "--max-num-seqs"):
            if batch_shape.option_value(profile.args, flag) is None:
                raise ConfigError(src.path, "speculation_max_batch", f"is set but the engine args have no {flag}",
                                  f"add {flag} to engine.args (or to the base profile) or remove speculation_max_batch")
        try:
            spec = json.loads(batch_shape.option_value(profile.args, "--speculative-config") or "")
            ok = isinstance(spec, dict) and int(spec.get("num_speculative_tokens", 0)) > 0
        except (ValueError, TypeError):
            ok = False
        if not ok:
            raise ConfigError(src.path, "speculation_max_batch",
                              "needs --speculative-config to be JSON with num_speculative_tokens >= 1",
                              "fix --speculative-config or remove speculation_max_batch")
    return profile


def load_profile_file(path: Path) -> Profile:
    """One profile file on its own; a profile that extends another needs load_profiles()."""
    src = _read_profile_file(path)
    if src.spec.extends is not None:
        raise ConfigError(path, "extends", f"extends {src.spec.extends!r}, which is not loaded here",
                          "load it together with its base (load_profiles, from the profile directories)")
    return _own_profile(src)


def load_profiles(settings: Settings) -> dict[str, Profile]:
    """All profiles from settings.paths.profile_dirs, later directories overriding earlier ones."""
    sources: dict[str, _ProfileSource] = {}
    for d in settings.paths.profile_dirs:
        if not d.is_dir():
            continue
        for path in sorted(d.glob("*.toml")):
            src = _read_profile_file(path)
            sources[src.name] = src
    resolved: dict[str, Profile] = {}
    for name in sources:
        _resolve(name, sources, resolved, ())
    return {name: resolved[name] for name in sources}


def _resolve(name: str, sources: dict[str, _ProfileSource], resolved: dict[str, Profile],
             chain: tuple[str, ...]) -> Profile:
    if name in resolved:
        return resolved[name]
    src = sources[name]
    base_name = src.spec.extends
    if base_name is None:
        profile = _own_profile(src)
    else:
        if base_name in chain or base_name == name:
            cycle = " -> ".join((*chain, name, base_name)[list((*chain, name)).index(base_name):])
            raise ConfigError(src.path, "extends", f"profiles extend each other in a cycle ({cycle})",
                              "remove extends from one of them")
        if base_name not in sources:
            known = ", ".join(sorted(n for n in sources if n != name)) or "none"
            raise ConfigError(src.path, "extends", f"unknown base profile {base_name!r} (known: {known})",
                              f"name a loaded profile or add {base_name}.toml to a profile directory")
        profile = _extend(src, _resolve(base_name, sources, resolved, (*chain, name)))
    resolved[name] = profile
    return profile


def _options(args: tuple[str, ...] | list[str]) -> list[list[str]]:
    """Split an argument list into options: a flag and the values up to the next flag."""
    groups: list[list[str]] = []
    for a in args:
        if _OPTION_RE.match(a) or not groups:
            groups.append([a])
        else:
            groups[-1].append(a)
    return groups


def _flag(option: list[str]) -> str | None:
    head = option[0]
    return head.split("=", 1)[0] if _OPTION_RE.match(head) else None


def _extend(src: _ProfileSource, base: Profile) -> Profile:
    pf = src.spec
    base_opts = _options(base.args)
    base_flags = {_flag(o) for o in base_opts}
    own_opts = _options(pf.engine.args)
    own_flags = {_flag(o) for o in own_opts} - {None}
    for f in pf.engine.remove_args:
        if f not in base_flags:
            raise ConfigError(src.path, "engine.remove_args", f"{f} is not in the args of {base.name} ({base.source})",
                              "remove it from engine.remove_args or check its spelling")
        if f in own_flags:
            raise ConfigError(src.path, "engine.remove_args", f"{f} is both removed and set in engine.args",
                              "keep one of the two")
    args: list[str] = []
    placed: set[str] = set()
    for opt in base_opts:
        f = _flag(opt)
        if f in pf.engine.remove_args:
            continue
        if f in own_flags:  # replaced in the base's place, by every option of that flag the profile sets
            if f not in placed:
                args += [a for o in own_opts if _flag(o) == f for a in o]
                placed.add(f)
            continue
        args += opt
    args += [a for o in own_opts if _flag(o) not in placed for a in o]
    paths = tuple(dict.fromkeys((*base.required_paths, *pf.requires.paths)))
    return _checked(src, Profile(
        name=src.name, source=src.path, description=pf.description,
        memory_gib=base.memory_gib if pf.memory_gib is None else pf.memory_gib,
        args=tuple(args), env={**base.env, **pf.engine.env}, required_paths=paths,
        needs_gpu=base.needs_gpu if pf.requires.gpu is None else pf.requires.gpu,
        needs_cluster=base.needs_cluster if pf.requires.cluster is None else pf.requires.cluster,
        extends=base.name,
        cuda_graph_sizes=_sizes(pf.cuda_graph_sizes) or base.cuda_graph_sizes,
        speculation_max_batch=base.speculation_max_batch if pf.speculation_max_batch is None
        else pf.speculation_max_batch, model=base.model if pf.model is None else pf.model))


def unknown_profiles(names: Iterable[str], known: Iterable[str]) -> str:
    """The one wording for profile names that do not exist, wherever a name comes in (the
    settings, the admin API, the CLI, bench ab, the FlashInfer build)."""
    names = list(names)
    what = f"unknown profile {names[0]!r}" if len(names) == 1 else \
        f"unknown profiles {', '.join(repr(n) for n in names)}"
    return f"{what} (known: {', '.join(sorted(known)) or 'none'})"


def get_profile(profiles: dict[str, Profile], name: str, settings: Settings) -> Profile:
    if name not in profiles:
        dirs = ", ".join(str(d) for d in settings.paths.profile_dirs)
        raise ConfigError(settings.source or "gptoss-spark.toml", "default_profile" if name == settings.default_profile else None,
                          unknown_profiles([name], profiles),
                          f"pick a known one or add {name}.toml to one of: {dirs}")
    return profiles[name]
