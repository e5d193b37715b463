"""The settings of an instance (gptoss-spark@NAME runs `serve --config /etc/gptoss-spark/NAME.toml`,
gptoss_spark/install/instances.py) against those of the default service beside it.

An instance's file is a whole settings file, so a key left out takes the default's value: a
forgotten paths.state_dir would share state.json and the caches with the default service (both
writable under the unit's sandbox, nothing would fail, the two would overwrite each other's
state); a forgotten port or served_name clashes with it. `serve` and `check` refuse such a file
with one line, before anything starts.
"""

from __future__ import annotations

from pathlib import Path

from ..base.defaults import CLAIMS_DIR, DEFAULT_CONFIG_PATH, STATE_DIR
from ..base.errors import ConfigError
from .config import Settings, load_settings

UNIT = "gptoss-spark"
# What the default service keeps in its state dir, beside the instances' dirs: an instance of one of
# these names would get the default's directory as its state dir.
TAKEN_NAMES = frozenset({CLAIMS_DIR.name, "cache", "tiktoken", "demo-model"})


def instance_name(config: Path) -> str | None:
    """NAME for /etc/gptoss-spark/NAME.toml other than the default's file; None for any other path."""
    config = Path(config)
    if config.parent != DEFAULT_CONFIG_PATH.parent or config.suffix != ".toml" or config == DEFAULT_CONFIG_PATH:
        return None
    return config.stem


def service_name(state_dir: Path) -> str:
    """The unit that runs a service with this state dir (gptoss-spark for STATE_DIR,
    gptoss-spark@NAME for STATE_DIR/NAME, as check_instance holds an instance's file to), else the
    state dir itself: what a memory claim is keyed by and named as. Unique per running service, as
    the state dir must be; the served name is not (two instances may serve one name on two ports)."""
    if state_dir == STATE_DIR:
        return UNIT
    if state_dir.parent == STATE_DIR:
        return f"{UNIT}@{state_dir.name}"
    return str(state_dir)


def check_instance(settings: Settings, config: Path, *, default_config: Path = DEFAULT_CONFIG_PATH,
                   state_root: Path = STATE_DIR, name: str | None = None) -> None:
    """ConfigError if an instance's settings share the state dir, a port or the served name with the
    default service's (its file, when there is one). Not an instance's file: nothing to check."""
    name = name or instance_name(config)
    if name is None:
        return
    if name in TAKEN_NAMES:
        raise ConfigError(config, None, f"the instance name {name!r} is a directory of the default service's "
                          f"({state_root / name})", f"rename the file: any name but {', '.join(sorted(TAKEN_NAMES))}")
    want = state_root / name
    if settings.paths.state_dir != want:
        raise ConfigError(config, "paths.state_dir", f"is {settings.paths.state_dir}, but the unit "
                          f"gptoss-spark@{name} gives this instance {want} (the others are another service's)",
                          f'set state_dir = "{want}" in [paths]')
    if not default_config.exists():
        return
    default = load_settings(default_config)
    clashes = [(f"{section}.port", getattr(settings, section).port) for section in ("engine", "admin")
               if getattr(settings, section).port in (default.engine.port, default.admin.port)]
    if settings.model.served_name == default.model.served_name:
        clashes.append(("model.served_name", settings.model.served_name))
    if clashes:
        key, value = clashes[0]
        raise ConfigError(config, key, f"{value!r} is the default service's too ({default_config})",
                          f"give this instance its own {key} (docs/CONFIGURATION.md, \"gpt-oss-20b, and both at once\")")
    if settings.claims_dir != default.claims_dir:
        raise ConfigError(config, "memory.claims_dir", f"is {settings.claims_dir}, the default service's "
                          f"is {default.claims_dir}: neither would see the other's memory claim",
                          "set the same claims_dir in both files, or leave it out of both")
