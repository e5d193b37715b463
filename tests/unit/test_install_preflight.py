"""Preflight with fake hosts: a Spark, other GPUs, no or old driver, no CUDA toolkit, full disk, bad Python."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest

from gptoss_spark.base import exit_codes as codes
from gptoss_spark.install.layout import Layout
from gptoss_spark.install.preflight import Probes, parse_gpus, run_preflight
from gptoss_spark.install.toolkit import REQUIRED_HEADERS, REQUIRED_LIBS, parse_nvcc_release

GIB = 1024 ** 3
SPARK_SMI = "NVIDIA GB10, 12.1, 580.95.05\n"
NVCC_13 = ("nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\n"
           "Build cuda_13.0.r13.0/compiler.36424714_0\n")


def nvcc_raises(exc):
    def run(path):
        raise exc
    return run


def probes(**kw) -> Probes:
    base = dict(
        euid=lambda: 0,
        machine=lambda: "aarch64",
        systemd_booted=lambda: True,
        which=lambda name: f"/usr/bin/{name}",
        nvidia_smi=lambda: (0, SPARK_SMI),
        python_facts=lambda py: ((3, 12, 3), True),
        free_bytes=lambda p: (500 * GIB, 1),
        mode_of=lambda p: stat.S_IFDIR | 0o755,
        env=lambda name: None,
        nvcc_version=lambda path: (0, NVCC_13),
        is_file=lambda p: True,
    )
    base.update(kw)
    return Probes(**base)


def pf(tmp_path: Path, *, cpu=False, allow=False, venv_exists=False, reclaimable=0, **kw):
    return run_preflight(Layout(root=tmp_path), cpu=cpu, allow_unsupported_gpu=allow, python="/usr/bin/python3",
                         source=None, venv_exists=venv_exists, probes=probes(**kw), reclaimable=reclaimable)


def test_spark_passes(tmp_path):
    r = pf(tmp_path)
    assert r.exit_code == 0, r.render()
    assert "GB10" in r.render()


def test_missing_checkpoint_warns_but_passes(tmp_path):
    r = pf(tmp_path)
    ck = next(c for c in r.checks if c.name == "checkpoint")
    assert ck.ok and ck.warning and "no checkpoint" in ck.message


@pytest.mark.parametrize("kw,code", [
    (dict(euid=lambda: 1000), codes.EXIT_NOT_ROOT),
    (dict(systemd_booted=lambda: False), codes.EXIT_NO_SYSTEMD),
    (dict(which=lambda n: None), codes.EXIT_NO_SYSTEMD),
    (dict(machine=lambda: "x86_64"), codes.EXIT_WRONG_ARCH),
    (dict(nvidia_smi=lambda: (_ for _ in ()).throw(FileNotFoundError("nvidia-smi"))), codes.EXIT_NO_GPU),
    (dict(nvidia_smi=lambda: (9, "NVIDIA-SMI has failed because it couldn't communicate with the driver")),
     codes.EXIT_NO_GPU),
    (dict(nvidia_smi=lambda: (0, "NVIDIA H100 80GB HBM3, 9.0, 570.1\n")), codes.EXIT_WRONG_GPU),
    (dict(nvidia_smi=lambda: (0, "NVIDIA GeForce RTX 5090, 12.0, 580.1\n")), codes.EXIT_WRONG_GPU),
    (dict(python_facts=lambda py: ((3, 10, 12), True)), codes.EXIT_PYTHON),
    (dict(python_facts=lambda py: ((3, 12, 3), False)), codes.EXIT_PYTHON),
    (dict(python_facts=lambda py: None), codes.EXIT_PYTHON),
    (dict(free_bytes=lambda p: (5 * GIB, 1)), codes.EXIT_DISK),
    (dict(nvidia_smi=lambda: (0, "NVIDIA GB10, 12.1, 575.57.08\n")), codes.EXIT_DRIVER),
    (dict(nvidia_smi=lambda: (0, "NVIDIA GB10, 12.1, [N/A]\n")), codes.EXIT_DRIVER),
    (dict(nvcc_version=nvcc_raises(FileNotFoundError("nvcc"))), codes.EXIT_TOOLKIT),
    (dict(nvcc_version=nvcc_raises(subprocess.TimeoutExpired("nvcc", 60))), codes.EXIT_TOOLKIT),
    (dict(nvcc_version=lambda p: (1, "nvcc fatal: something")), codes.EXIT_TOOLKIT),
    (dict(nvcc_version=lambda p: (0, "Cuda compilation tools, release 12.8, V12.8.93\n")), codes.EXIT_TOOLKIT),
    (dict(nvcc_version=lambda p: (0, "Cuda compilation tools, release 14.0, V14.0.1\n")), codes.EXIT_TOOLKIT),
    (dict(nvcc_version=lambda p: (0, "no version here\n")), codes.EXIT_TOOLKIT),
    (dict(is_file=lambda p: not str(p).endswith("cublasLt.h")), codes.EXIT_TOOLKIT),
    (dict(which=lambda n: None if n == "g++" else f"/usr/bin/{n}"), codes.EXIT_TOOLKIT),
])
def test_each_failure_has_its_own_exit_code_and_one_line(tmp_path, kw, code):
    r = pf(tmp_path, **kw)
    assert r.exit_code == code
    failed = [c for c in r.checks if not c.ok]
    assert failed and "\n" not in failed[0].message


def test_nvidia_smi_timeout_is_a_gpu_failure(tmp_path):
    def hang():
        raise subprocess.TimeoutExpired("nvidia-smi", 60)
    assert pf(tmp_path, nvidia_smi=hang).exit_code == codes.EXIT_NO_GPU


def test_first_failure_decides(tmp_path):
    r = pf(tmp_path, euid=lambda: 1000, free_bytes=lambda p: (1, 1))
    assert r.exit_code == codes.EXIT_NOT_ROOT
    assert sum(not c.ok for c in r.checks) == 2  # but every problem is reported


def test_override_accepts_other_gpu_with_a_warning(tmp_path):
    r = pf(tmp_path, allow=True, machine=lambda: "x86_64", nvidia_smi=lambda: (0, "NVIDIA H200, 9.0, 580.82.07\n"))
    assert r.exit_code == 0, r.render()
    assert any(c.warning and "H200" in c.message for c in r.checks)


def test_override_still_needs_a_gpu(tmp_path):
    r = pf(tmp_path, allow=True, nvidia_smi=lambda: (_ for _ in ()).throw(FileNotFoundError()))
    assert r.exit_code == codes.EXIT_NO_GPU


def test_cpu_mode_skips_gpu_and_arch(tmp_path):
    r = pf(tmp_path, cpu=True, machine=lambda: "x86_64",
           nvidia_smi=lambda: (_ for _ in ()).throw(AssertionError("must not probe the GPU")))
    assert r.exit_code == 0
    assert "demonstration" in r.render()


def test_cpu_mode_needs_less_disk(tmp_path):
    assert pf(tmp_path, cpu=True, free_bytes=lambda p: (12 * GIB, 1)).exit_code == 0
    assert pf(tmp_path, free_bytes=lambda p: (12 * GIB, 1)).exit_code == codes.EXIT_DISK


def test_rerun_with_venv_present_needs_no_venv_space(tmp_path):
    assert pf(tmp_path, venv_exists=True, free_bytes=lambda p: (12 * GIB, 1)).exit_code == 0


def test_versions_no_link_names_count_as_free(tmp_path):
    """A venv kept after an exit 29 is removed by the build step before it builds: the disk check counts it."""
    assert pf(tmp_path, cpu=True, free_bytes=lambda p: (2 * GIB, 1)).exit_code == codes.EXIT_DISK
    r = pf(tmp_path, cpu=True, free_bytes=lambda p: (2 * GIB, 1), reclaimable=10 * GIB)
    assert r.exit_code == 0 and "counting 10.0 GiB of versions no link names" in r.render()


def test_disk_on_separate_filesystems(tmp_path):
    devs = {"opt": (21 * GIB, 1), "var": (1 * GIB, 2)}
    r = pf(tmp_path, free_bytes=lambda p: devs["opt" if "opt" in str(p) else "var"])
    assert r.exit_code == codes.EXIT_DISK and "/var/lib/gptoss-spark" in r.render()


def test_interpreter_under_private_home_is_refused(tmp_path):
    def mode_of(p: Path) -> int:
        return stat.S_IFDIR | (0o700 if str(p) == "/root" else 0o755)
    r = run_preflight(Layout(root=tmp_path), cpu=True, allow_unsupported_gpu=False,
                      python="/root/.pyenv/versions/3.11.7/bin/python3", probes=probes(mode_of=mode_of))
    assert r.exit_code == codes.EXIT_PYTHON and "/root" in r.render()


def test_checkpoint_found(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model-00001.safetensors").write_bytes(b"")
    src = tmp_path / "src"
    (src / "etc").mkdir(parents=True)
    (src / "etc" / "gptoss-spark.toml").write_text(f'[model]\ndir = "{model}"\n')
    r = run_preflight(Layout(root=tmp_path / "root"), cpu=False, allow_unsupported_gpu=False,
                      python="/usr/bin/python3", source=src, probes=probes())
    ck = next(c for c in r.checks if c.name == "checkpoint")
    assert ck.ok and not ck.warning


def test_parse_gpus():
    assert parse_gpus(SPARK_SMI) == [("NVIDIA GB10", "12.1", "580.95.05")]
    assert parse_gpus("") == []


def test_spark_checks_driver_toolkit_and_compiler(tmp_path):
    r = pf(tmp_path)
    names = [c.name for c in r.checks]
    assert {"driver", "cuda toolkit", "compiler"} <= set(names), r.render()
    assert "nvcc 13.0" in r.render()


@pytest.mark.parametrize("missing", [*REQUIRED_HEADERS, *REQUIRED_LIBS])
def test_each_missing_toolkit_file_is_named_with_the_package_to_install(tmp_path, missing):
    r = pf(tmp_path, is_file=lambda p: not str(p).endswith("/" + missing))
    assert r.exit_code == codes.EXIT_TOOLKIT
    msg = next(c.message for c in r.checks if not c.ok)
    assert missing in msg and "apt install cuda-toolkit-13-0" in msg and "\n" not in msg


def test_old_driver_names_the_minimum(tmp_path):
    r = pf(tmp_path, nvidia_smi=lambda: (0, "NVIDIA GB10, 12.1, 570.124.06\n"))
    msg = next(c.message for c in r.checks if not c.ok)
    assert "570.124.06" in msg and ">= 580" in msg


@pytest.mark.parametrize("env, which, expected", [
    ({"CUDA_HOME": "/opt/cuda-13.0", "CUDA_PATH": "/elsewhere"}, "/usr/local/cuda-13.0/bin/nvcc",
     "/opt/cuda-13.0/bin/nvcc"),
    ({"CUDA_PATH": "/opt/cuda"}, "/usr/local/cuda-13.0/bin/nvcc", "/opt/cuda/bin/nvcc"),
    ({}, "/usr/local/cuda-13.0/bin/nvcc", "/usr/local/cuda-13.0/bin/nvcc"),
    ({}, None, "/usr/local/cuda/bin/nvcc"),
])
def test_toolkit_is_looked_for_where_flashinfer_looks(tmp_path, env, which, expected):
    """FlashInfer 0.7.0.post1's get_cuda_path: CUDA_HOME, CUDA_PATH, nvcc on PATH, /usr/local/cuda."""
    seen = []

    def nvcc_version(path):
        seen.append(str(path))
        return 0, NVCC_13
    r = pf(tmp_path, env=env.get, nvcc_version=nvcc_version,
           which=lambda n: which if n == "nvcc" else f"/usr/bin/{n}")
    assert seen == [expected]
    assert r.exit_code == 0, r.render()


def test_toolkit_missing_names_where_it_looked(tmp_path):
    r = pf(tmp_path, which=lambda n: None if n == "nvcc" else f"/usr/bin/{n}",
           nvcc_version=nvcc_raises(FileNotFoundError("nvcc")))
    msg = next(c.message for c in r.checks if not c.ok)
    assert "/usr/local/cuda/bin/nvcc" in msg and "cuda-toolkit-13-0" in msg and "CUDA_HOME" in msg


def test_wrong_arch_skips_the_toolkit(tmp_path):
    r = pf(tmp_path, machine=lambda: "x86_64", nvcc_version=nvcc_raises(AssertionError("must not run nvcc")))
    assert r.exit_code == codes.EXIT_WRONG_ARCH
    assert "cuda toolkit" not in [c.name for c in r.checks]


def test_unsupported_gpu_override_still_checks_driver_and_toolkit(tmp_path):
    r = pf(tmp_path, allow=True, machine=lambda: "x86_64", nvidia_smi=lambda: (0, "NVIDIA H200, 9.0, 570.1\n"))
    assert r.exit_code == codes.EXIT_DRIVER
    assert "cuda toolkit" in [c.name for c in r.checks]


def test_cpu_mode_checks_no_toolkit(tmp_path):
    r = pf(tmp_path, cpu=True, nvcc_version=nvcc_raises(AssertionError("must not run nvcc")),
           which=lambda n: None if n == "g++" else f"/usr/bin/{n}")
    assert r.exit_code == 0
    assert not {"driver", "cuda toolkit", "compiler"} & {c.name for c in r.checks}


def test_cpu_rerun_says_the_demo_model_is_present(tmp_path):
    layout = Layout(root=tmp_path)
    first = next(c for c in pf(tmp_path, cpu=True).checks if c.name == "checkpoint")
    assert "will be generated" in first.message
    layout.demo_model_dir.mkdir(parents=True)
    (layout.demo_model_dir / "config.json").write_text("{}")
    again = next(c for c in pf(tmp_path, cpu=True).checks if c.name == "checkpoint")
    assert "present at /var/lib/gptoss-spark/demo-model" in again.message
    assert "generated" not in again.message


def test_parse_nvcc_release():
    assert parse_nvcc_release(NVCC_13) == (13, 0)
    assert parse_nvcc_release("release 13.1, V13.1.80") == (13, 1)
    assert parse_nvcc_release("") is None
