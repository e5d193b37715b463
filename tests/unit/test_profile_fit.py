"""Which profiles can run on this host, and why not: the shipped set as a --cpu install has it.

The host facts (GPU count, MemTotal) are passed in, so the same answers hold on any test box.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gptoss_spark.service import profiles as profiles_mod
from gptoss_spark.admin_cli import render_profiles
from gptoss_spark.service.config import load_settings
from gptoss_spark.base.errors import RequirementError
from gptoss_spark.service.fit import why_not
from gptoss_spark.service.profiles import load_profiles

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cpu_install(tmp_path):
    """Settings like install.sh --cpu's: the demo checkpoint present, no Eagle3 head, both profile dirs."""
    model = tmp_path / "demo-model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    s = load_settings(REPO / "etc" / "gptoss-spark.toml")
    return s.model_copy(update={
        "model": s.model.model_copy(update={"dir": model, "eagle3_dir": tmp_path / "no-eagle3"}),
        "paths": s.paths.model_copy(update={"profile_dirs": [REPO / "etc" / "profiles", REPO / "etc" / "profiles-cpu"]}),
    })


def test_on_a_cpu_host_only_demo_runs_and_each_other_says_why(cpu_install, tmp_path):
    loaded = load_profiles(cpu_install)
    fit = {name: why_not(p, cpu_install, total_gib=23.4, gpus=0) for name, p in loaded.items()}
    assert fit["demo"] == []
    gpu = f"needs an NVIDIA GPU, none found ({profiles_mod.NVIDIA_GPUS_DIR})"
    assert fit["plain"] == [gpu, "needs 84 GiB, the host has 23.4 GiB in all"]
    assert fit["fast"][0] == gpu  # extends plain: inherits requires.gpu
    assert fit["spec"][0] == gpu and fit["spec"][-1] == f"missing {tmp_path}/no-eagle3/config.json"
    assert fit["spec"][1].startswith(f"needs {loaded['spec'].memory_gib:g} GiB")


def test_on_a_spark_the_shipped_profiles_fit(cpu_install, tmp_path):
    (tmp_path / "no-eagle3").mkdir()
    (tmp_path / "no-eagle3" / "config.json").write_text("{}")
    loaded = load_profiles(cpu_install)
    assert all(why_not(p, cpu_install, total_gib=119.7, gpus=1) == [] for p in loaded.values() if not p.needs_cluster)
    # The two-node profiles say why not on one node.
    assert {n for n, p in loaded.items() if p.needs_cluster} == {"cluster", "demo-cluster"}
    assert all(why_not(p, cpu_install, total_gib=119.7, gpus=1) == ["runs across two nodes; no [cluster] is set "
                                                                      "(docs/CLUSTER.md)"]
               for p in loaded.values() if p.needs_cluster)


def test_a_start_without_a_gpu_is_refused_as_a_requirement(cpu_install, monkeypatch, tmp_path):
    monkeypatch.setattr(profiles_mod, "NVIDIA_GPUS_DIR", tmp_path / "absent")
    plain = load_profiles(cpu_install)["plain"]
    with pytest.raises(RequirementError, match=r"^profile plain: needs an NVIDIA GPU and this host has none"):
        plain.check_requirements(cpu_install)
    gpus = tmp_path / "gpus"
    (gpus / "0000:01:00.0").mkdir(parents=True)
    monkeypatch.setattr(profiles_mod, "NVIDIA_GPUS_DIR", gpus)
    plain.check_requirements(cpu_install)  # one GPU listed: met


def test_the_cli_listing_says_which_cannot_run_here():
    body = {"active": "demo", "state": "ready", "last_good": "demo", "profiles": [
        {"name": "demo", "description": "tiny", "active": True, "why_not": []},
        {"name": "plain", "description": "many users", "active": False,
         "why_not": ["needs an NVIDIA GPU, none found (/proc/driver/nvidia/gpus)", "needs 84 GiB, the host has 23.4 GiB in all"]},
    ]}
    lines = render_profiles(body).splitlines()
    assert lines[1].split() == ["*", "demo", "tiny"]
    assert lines[2].split()[:3] == ["plain", "many", "users"]
    assert lines[3].strip() == ("cannot run here: needs an NVIDIA GPU, none found (/proc/driver/nvidia/gpus); "
                                "needs 84 GiB, the host has 23.4 GiB in all")
    assert len(lines) == 4  # demo runs here: no line for it
