"""Every shipped GPU profile loads its weights with fastsafetensors, and the Spark lock installs it.

Why it matters: with vLLM's default reader the whole checkpoint stays in the page cache beside its
device copy, ~2x the weights at peak on the Spark's unified memory (docs/INSTALL.md, "Weight
loading"). A profile that drops the flag (or an `extends` that loses it) falls back silently;
a lock without the package makes every GPU start fail at load.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from gptoss_spark.install.locks import read_pins
from gptoss_spark.service.config import Settings
from gptoss_spark.service.profiles import load_profiles

REPO = Path(__file__).resolve().parents[2]
LOADER = "fastsafetensors"


def load_formats(argv: list[str]) -> list[str]:
    """Every --load-format value in an argv, both spellings, in order (argparse keeps the last)."""
    out = []
    for i, a in enumerate(argv):
        if a == "--load-format" and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif a.startswith("--load-format="):
            out.append(a.split("=", 1)[1])
    return out


def shipped(directory: str) -> tuple[Settings, dict]:
    settings = Settings.model_validate({"paths": {"profile_dirs": [str(REPO / "etc" / directory)]}})
    return settings, load_profiles(settings)  # the real loader: `extends` and remove_args resolved


def test_every_shipped_gpu_profile_loads_with_fastsafetensors():
    settings, profiles = shipped("profiles")
    assert {"plain", "spec", "fast", "cluster"} <= set(profiles)
    for name, profile in profiles.items():
        # etc/profiles holds the GPU profiles; the CPU ones live in etc/profiles-cpu.
        assert profile.needs_gpu, f"{name}: in etc/profiles but not requires.gpu"
        assert load_formats(profile.engine_args(settings)) == [LOADER], name


def test_cpu_profiles_keep_vllms_default_loader():
    """fastsafetensors copies to a CUDA device; the CPU venv does not install it."""
    settings, profiles = shipped("profiles-cpu")
    assert profiles and all(load_formats(p.engine_args(settings)) == [] for p in profiles.values())


def test_load_formats_reads_both_spellings():
    assert load_formats(["--load-format", "auto", "--x", "--load-format=fastsafetensors"]) == ["auto", LOADER]


@pytest.mark.parametrize("lock", sorted(p.name for p in (REPO / "locks").glob("spark-*.txt")))
def test_the_spark_lock_pins_fastsafetensors_as_pyproject_does(lock):
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    wanted = next((re.fullmatch(rf"{LOADER}==(\S+)", r) for r in extras["spark"] if r.startswith(LOADER)), None)
    assert wanted, f"pyproject.toml's spark extra does not pin {LOADER} exactly"
    version, hashes = read_pins(REPO / "locks" / lock)[LOADER]
    assert version == wanted.group(1) and hashes, f"{lock}: {LOADER}=={version}, {len(hashes)} hashes"


def test_there_is_a_spark_lock():
    assert list((REPO / "locks").glob("spark-*.txt"))
