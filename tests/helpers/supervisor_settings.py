"""Settings and memory readings for supervisor tests: profiles whose engines are scripted stand-ins
(FAKE_ENGINE_MODE for tests/helpers/fake_engine.py, or the in-process fake of
tests/unit/test_supervisor_policy.py), short timeouts so each scenario takes seconds."""

from __future__ import annotations

import socket
from pathlib import Path

from gptoss_spark.service.config import Settings
from gptoss_spark.service.memory import GIB, MemoryReading


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeMemory:
    def __init__(self, available_gib: float = 100.0, psi: float | None = 0.0):
        self.available_gib = available_gib
        self.psi = psi

    def read(self) -> MemoryReading:
        return MemoryReading(int(self.available_gib * GIB), 128 * GIB, self.psi)


def make_settings(tmp: Path, profiles: dict[str, str], **overrides) -> Settings:
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    pdir = tmp / "profiles"
    pdir.mkdir(exist_ok=True)
    for name, mode in profiles.items():
        (pdir / f"{name}.toml").write_text(
            f'description = "fake {name}"\nmemory_gib = 10\n[engine]\nenv = {{ FAKE_ENGINE_MODE = "{mode}", '
            f'FAKE_ENGINE_MARKER = "{tmp}/marker-{name}" }}\n')
    data = {
        "default_profile": next(iter(profiles)),
        "model": {"dir": str(model)},
        "engine": {"port": free_port()},
        "admin": {"port": free_port()},
        "paths": {"state_dir": str(tmp / "state"), "profile_dirs": [str(pdir)]},
        "timeouts": {"load": 10, "canary": 1, "drain": 1, "shutdown_grace": 1.5, "probe_interval": 0.2,
                     "probe_timeout": 1},
        "restart": {"backoff_initial": 0.1, "backoff_max": 0.3, "max_crashes": 3, "window": 60},
        "wedge": {"canary_interval": 0.5, "stall_seconds": 1},
        "memory": {"start_floor_gib": 1, "danger_available_gib": 2, "check_interval": 0.1},
    }
    for section, values in overrides.items():
        data[section] = {**data.get(section, {}), **values}
    return Settings.model_validate(data)
