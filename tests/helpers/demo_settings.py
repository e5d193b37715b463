"""The settings file a test or benchmark runs `gptoss-spark serve` with: the tiny demo model on
loopback ports of its own, short timeouts, the memory guard relaxed for a shared 2-core box.

One writer, so every harness starts the service the same way; each passes only what differs
(its ports, its directories, a section's values; None drops a key, so the service's own
default applies).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# Section -> key -> value, as the harnesses share them.
BASE: dict[str, dict[str, Any]] = {
    "timeouts": {"load": 900, "canary": 60, "drain": 3, "shutdown_grace": 8, "probe_interval": 2},
    "wedge": {"canary_interval": 0},  # no canary request while a test measures or waits
    "memory": {"start_floor_gib": 0.5, "danger_available_gib": 0.2, "danger_psi_some_avg10": 100},
}


def _value(v: Any) -> str:
    # The values these files hold: numbers, strings (paths) and lists of them; json writes each
    # the way TOML reads it.
    return json.dumps(str(v) if isinstance(v, Path) else v)


def demo_settings_toml(*, model_dir: Path, state_dir: Path, profile_dirs: list[Path], token_file: Path,
                       engine_port: int, admin_port: int, default_profile: str = "demo",
                       cpu: int | None = None, **sections: dict[str, Any]) -> str:
    """The settings file's text. `sections` adds a section or changes keys of one (engine, admin,
    timeouts, restart, cluster, ...); a key given None is left out."""
    cpu = os.cpu_count() - 1 if cpu is None else cpu
    tables: dict[str, dict[str, Any]] = {
        "model": {"dir": model_dir, "tiktoken_dir": model_dir},
        "engine": {"port": engine_port, "cpu_affinity": [cpu]},
        "admin": {"port": admin_port, "token_file": token_file},
        "paths": {"state_dir": state_dir, "profile_dirs": [str(p) for p in profile_dirs]},
        **{name: dict(keys) for name, keys in BASE.items()},
    }
    for name, keys in sections.items():
        tables.setdefault(name, {}).update(keys)
    lines = [f"default_profile = {_value(default_profile)}"]
    for name, keys in tables.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {_value(v)}" for k, v in keys.items() if v is not None]
    return "\n".join(lines) + "\n"
