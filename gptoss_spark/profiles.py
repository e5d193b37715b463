"""Profiles: what the engine runs. One TOML file per profile, named by its file.

    description = "one line shown by the admin API"
    memory_gib = 85                       # expected peak use; the memory guard checks it
    [engine]
    args = ["--max-num-seqs", "32"]       # vLLM arguments, beyond the ones we own
    env = { VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8 = "1" }
    [requires]
    paths = ["{eagle3_dir}/config.json"]  # must exist before any start

Placeholders {model_dir}, {eagle3_dir} and {served_name} are filled from the
settings in args, env values and required paths: a profile names each fact once.
Any other {lowercase_word} is an error (a typo); JSON braces are left alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .config import Settings, read_toml, validation_to_config_error
from .errors import ConfigError, RequirementError

PROFILE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
PLACEHOLDERS = ("model_dir", "eagle3_dir", "served_name")
_PLACEHOLDER_RE = re.compile(r"\{([a-z_][a-z0-9_]*)\}")

# Arguments the supervisor sets from the settings; a profile may not set them,
# or the engine would listen somewhere the probes do not look.
RESERVED_ARGS = {
    "--model": "model.dir", "--served-model-name": "model.served_name",
    "--host": "engine.host", "--port": "engine.port",
    "--shutdown-timeout": "timeouts.drain", "--api-key": "engine.api_key_file",
}


class _ProfileEngine(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    args: list[str] = []
    env: dict[str, str] = {}

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


class _ProfileFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    description: str = Field(..., min_length=1, max_length=200)
    memory_gib: float = Field(0.0, ge=0)
    engine: _ProfileEngine = _ProfileEngine()
    requires: _ProfileRequires = _ProfileRequires()


@dataclass(frozen=True)
class Profile:
    name: str
    source: Path
    description: str
    memory_gib: float
    args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    required_paths: tuple[str, ...] = ()

    def _fill(self, text: str, settings: Settings, key: str) -> str:
        values = {"model_dir": str(settings.model.dir), "eagle3_dir": str(settings.model.eagle3_dir),
                  "served_name": settings.model.served_name}

        # Only {lowercase_word} is a placeholder, so JSON values like '{"method": ...}' pass untouched.
        def sub(m: re.Match[str]) -> str:
            if m.group(1) not in values:
                raise ConfigError(self.source, key, f"unknown placeholder {m.group(0)} in {text!r}",
                                  f"use one of {', '.join('{' + p + '}' for p in PLACEHOLDERS)}")
            return values[m.group(1)]

        return _PLACEHOLDER_RE.sub(sub, text)

    def engine_args(self, settings: Settings) -> list[str]:
        return [self._fill(a, settings, "engine.args") for a in self.args]

    def engine_env(self, settings: Settings) -> dict[str, str]:
        return {k: self._fill(v, settings, f"engine.env.{k}") for k, v in self.env.items()}

    def check_requirements(self, settings: Settings) -> None:
        """Raise RequirementError (one line) if this host cannot run the profile."""
        model_dir = settings.model.dir
        if not (model_dir / "config.json").is_file():
            raise RequirementError(
                f"profile {self.name}: no checkpoint at {model_dir} (config.json missing); "
                f"download gpt-oss-120b there or set model.dir in {settings.source or 'gptoss-spark.toml'}")
        for raw in self.required_paths:
            p = Path(self._fill(raw, settings, "requires.paths"))
            if not p.exists():
                raise RequirementError(
                    f"profile {self.name}: required path {p} does not exist ({self.source}: requires.paths); "
                    "put the file there or fix the path in the settings/profile")


def load_profile_file(path: Path) -> Profile:
    name = path.stem
    if not PROFILE_NAME_RE.match(name):
        raise ConfigError(path, None, f"profile name {name!r} is not allowed",
                          "rename the file to lowercase letters, digits, '-' or '_' (at most 32), ending in .toml")
    data = read_toml(path, "profile file")
    try:
        pf = _ProfileFile.model_validate(data)
    except ValidationError as e:
        raise validation_to_config_error(path, e) from None
    return Profile(name=name, source=path, description=pf.description, memory_gib=pf.memory_gib,
                   args=tuple(pf.engine.args), env=dict(pf.engine.env), required_paths=tuple(pf.requires.paths))


def load_profiles(settings: Settings) -> dict[str, Profile]:
    """All profiles from settings.paths.profile_dirs, later directories overriding earlier ones."""
    profiles: dict[str, Profile] = {}
    for d in settings.paths.profile_dirs:
        if not d.is_dir():
            continue
        for path in sorted(d.glob("*.toml")):
            p = load_profile_file(path)
            profiles[p.name] = p
    return profiles


def get_profile(profiles: dict[str, Profile], name: str, settings: Settings) -> Profile:
    if name not in profiles:
        known = ", ".join(sorted(profiles)) or "none"
        dirs = ", ".join(str(d) for d in settings.paths.profile_dirs)
        raise ConfigError(settings.source or "gptoss-spark.toml", "default_profile" if name == settings.default_profile else None,
                          f"unknown profile {name!r} (known: {known})",
                          f"pick a known one or add {name}.toml to one of: {dirs}")
    return profiles[name]
