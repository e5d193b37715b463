"""Preflight: can this host take the install? Each check prints one line.

All host facts come through `Probes`, so tests can play any machine (a Spark,
an x86 box with an H100, no driver, an old driver, no CUDA toolkit, a full
disk) without having one. A Spark install also needs what FlashInfer's kernel
build needs on the host (toolkit.py).
The first failing check decides the exit code; missing checkpoints only warn
(the service itself reports them, with exit code 3, when it starts).
"""

from __future__ import annotations

import os
import platform
import shutil
import stat
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import toolkit
from .checks import Check, PreflightResult
from ..base.exit_codes import EXIT_DISK, EXIT_NOT_ROOT, EXIT_NO_GPU, EXIT_NO_SYSTEMD, EXIT_PYTHON, EXIT_WRONG_ARCH, EXIT_WRONG_GPU
from ..base.defaults import DEFAULT_CONFIG_PATH
from .layout import Layout

SPARK_ARCH = "aarch64"
SPARK_COMPUTE_CAP = "12.1"
MIN_PYTHON = (3, 11)
GIB = 1024 ** 3
# Room for one more venv (the previous one stays for rollback) plus caches.
# vllm + torch CUDA + flashinfer is ~12 GiB; compile caches grow to a few GiB.
DISK_GIB = {"spark": {"venv": 20, "state": 10}, "cpu": {"venv": 8, "state": 2}}


def _run_nvidia_smi() -> tuple[int, str]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise FileNotFoundError("nvidia-smi")
    p = subprocess.run([exe, "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"],
                       capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def _nvcc_version(nvcc: Path) -> tuple[int, str]:
    p = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def _python_facts(python: str) -> tuple[tuple[int, int, int], bool] | None:
    """(version, has venv+ensurepip) of an interpreter, None if it does not run."""
    code = ("import sys\ntry:\n import venv, ensurepip\n ok=1\nexcept Exception:\n ok=0\n"
            "print('%d.%d.%d %d' % (sys.version_info[:3] + (ok,)))")
    try:
        p = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:
        return None
    ver, ok = p.stdout.split()
    major, minor, micro = (int(x) for x in ver.split("."))
    return (major, minor, micro), ok == "1"


def _free_bytes(path: Path) -> tuple[int, int]:
    """(free bytes, device id) of the filesystem that will hold `path`."""
    p = path
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free, p.stat().st_dev


@dataclass
class Probes:
    euid: Callable[[], int] = os.geteuid
    machine: Callable[[], str] = platform.machine
    # sd_booted(): systemd is PID 1 iff this directory exists.
    systemd_booted: Callable[[], bool] = lambda: Path("/run/systemd/system").is_dir()
    which: Callable[[str], str | None] = shutil.which
    nvidia_smi: Callable[[], tuple[int, str]] = _run_nvidia_smi
    python_facts: Callable[[str], tuple[tuple[int, int, int], bool] | None] = _python_facts
    free_bytes: Callable[[Path], tuple[int, int]] = _free_bytes
    # Path -> st_mode, for "can the service user reach the interpreter".
    mode_of: Callable[[Path], int] = lambda p: p.stat().st_mode
    # The CUDA toolkit FlashInfer's build uses (toolkit.py).
    env: Callable[[str], str | None] = os.environ.get
    nvcc_version: Callable[[Path], tuple[int, str]] = _nvcc_version
    is_file: Callable[[Path], bool] = lambda p: p.is_file()


def parse_gpus(output: str) -> list[tuple[str, str, str]]:
    """nvidia-smi csv rows -> [(name, compute_cap, driver)]."""
    gpus = []
    for line in output.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0]:
            gpus.append((parts[0], parts[1], parts[2]))
    return gpus


def check_python(python: str, probes: Probes) -> Check:
    facts = probes.python_facts(python)
    if facts is None:
        return Check("python", False, f"{python} does not run; install Python >= 3.11 or pass --python PATH",
                     EXIT_PYTHON)
    (major, minor, micro), has_venv = facts
    if (major, minor) < MIN_PYTHON:
        return Check("python", False, f"{python} is {major}.{minor}.{micro}; need >= 3.11 "
                     "(pass --python PATH to another interpreter)", EXIT_PYTHON)
    if not has_venv:
        return Check("python", False, f"{python} has no venv/ensurepip module; "
                     f"install it: apt install python{major}.{minor}-venv", EXIT_PYTHON)
    # The service user must be able to exec the venv's interpreter, which is a
    # symlink to this one: a pyenv under /root (mode 700) gives 203/EXEC.
    real = Path(os.path.realpath(python))
    for d in [*reversed(real.parents)]:
        try:
            mode = probes.mode_of(d)
        except OSError:
            continue
        if not mode & stat.S_IXOTH:
            return Check("python", False, f"{real} sits under {d} (mode {stat.filemode(mode)}), which the "
                         "service user cannot enter; use the system interpreter (--python /usr/bin/python3)",
                         EXIT_PYTHON)
    return Check("python", True, f"{python} {major}.{minor}.{micro}")


def check_gpu(probes: Probes, allow_unsupported_gpu: bool) -> list[Check]:
    checks = []
    machine = probes.machine()
    if machine != SPARK_ARCH and not allow_unsupported_gpu:
        checks.append(Check("arch", False, f"this is {machine}, a DGX Spark is {SPARK_ARCH}; "
                            "use --cpu for a demonstration install, or --allow-unsupported-gpu", EXIT_WRONG_ARCH))
        return checks
    checks.append(Check("arch", True, machine, warning=machine != SPARK_ARCH))
    try:
        rc, out = probes.nvidia_smi()
    except (FileNotFoundError, OSError):
        checks.append(Check("gpu", False, "nvidia-smi not found: no NVIDIA driver; install the driver "
                            "(DGX OS ships it) or use --cpu for a demonstration install", EXIT_NO_GPU))
        return checks
    except subprocess.TimeoutExpired:
        checks.append(Check("gpu", False, "nvidia-smi hung for 60 s: the driver is unhealthy; reboot or "
                            "reinstall the driver", EXIT_NO_GPU))
        return checks
    gpus = parse_gpus(out) if rc == 0 else []
    if not gpus:
        first = (out.strip().splitlines() or ["no output"])[0]
        checks.append(Check("gpu", False, f"nvidia-smi found no GPU ({first}); check the driver "
                            "(nvidia-smi) or use --cpu for a demonstration install", EXIT_NO_GPU))
        return checks
    name, cap, driver = gpus[0]
    if cap != SPARK_COMPUTE_CAP:
        if allow_unsupported_gpu:
            checks.append(Check("gpu", True, f"{name} (compute capability {cap}, driver {driver}): not a "
                                "Spark, continuing because of --allow-unsupported-gpu", warning=True))
            checks.append(toolkit.check_driver(driver))
        else:
            checks.append(Check("gpu", False, f"{name} has compute capability {cap}; this service is built for "
                                f"the DGX Spark's GB10 ({SPARK_COMPUTE_CAP}); use --allow-unsupported-gpu to "
                                "try anyway, or --cpu for a demonstration install", EXIT_WRONG_GPU))
        return checks
    checks.append(Check("gpu", True, f"{name} (compute capability {cap}, driver {driver})"))
    checks.append(toolkit.check_driver(driver))
    return checks


def check_disk(layout: Layout, mode: str, probes: Probes, venv_exists: bool, reclaimable: int = 0) -> Check:
    """reclaimable: bytes of venvs no link names (one kept after an exit 29, say), which the build
    step removes before it builds: counted as free."""
    need = DISK_GIB[mode]
    venv_need = 0 if venv_exists else need["venv"] * GIB
    state_need = need["state"] * GIB
    venv_free, venv_dev = probes.free_bytes(layout.venvs_dir)
    venv_free += reclaimable
    state_free, state_dev = probes.free_bytes(layout.state_dir)
    if venv_dev == state_dev:
        wants = [(layout.real(layout.opt_dir), venv_free, venv_need + state_need)]
    else:
        wants = [(layout.real(layout.opt_dir), venv_free, venv_need),
                 (layout.real(layout.state_dir), state_free, state_need)]
    for where, free, needed in wants:
        if free < needed:
            return Check("disk", False, f"{where} has {free / GIB:.1f} GiB free, the install needs "
                         f"{needed / GIB:.0f} GiB; free some space", EXIT_DISK)
    counted = f" (counting {reclaimable / GIB:.1f} GiB of versions no link names, removed before the build)" \
        if reclaimable else ""
    return Check("disk", True, ", ".join(f"{w}: {f / GIB:.0f} GiB free" for w, f, _ in wants) + counted)


def configured_model_dir(layout: Layout, source: Path | None) -> Path | None:
    """model.dir from the installed config, else from the shipped default."""
    for cfg in (layout.config_file, (source / "etc" / "gptoss-spark.toml") if source else None):
        if cfg is not None and cfg.is_file():
            try:
                data = tomllib.loads(cfg.read_text())
            except (tomllib.TOMLDecodeError, OSError, UnicodeDecodeError):
                return None
            d = data.get("model", {}).get("dir")
            return Path(d) if d else Path("/srv/models/gpt-oss-120b")
    return Path("/srv/models/gpt-oss-120b")


def check_checkpoint(model_dir: Path | None) -> Check:
    if model_dir is None:
        return Check("checkpoint", True, "config unreadable, not checked", warning=True)
    has_cfg = (model_dir / "config.json").is_file()
    has_weights = model_dir.is_dir() and any(model_dir.glob("*.safetensors"))
    if has_cfg and has_weights:
        return Check("checkpoint", True, str(model_dir))
    return Check("checkpoint", True, f"no checkpoint at {model_dir} (config.json + *.safetensors); the service "
                 f"will not start until it is there: download it, or set model.dir in {DEFAULT_CONFIG_PATH}",
                 warning=True)


def check_demo_model(layout: Layout) -> Check:
    where = layout.real(layout.demo_model_dir)
    # The same test as the assets step, which makes the model only when this is absent.
    if (layout.demo_model_dir / "config.json").is_file():
        return Check("checkpoint", True, f"the tiny random demo model is present at {where}")
    return Check("checkpoint", True, f"a tiny random demo model will be generated at {where}")


def run_preflight(layout: Layout, *, cpu: bool, allow_unsupported_gpu: bool, python: str,
                  source: Path | None = None, venv_exists: bool = False,
                  probes: Probes | None = None, reclaimable: int = 0) -> PreflightResult:
    probes = probes or Probes()
    r = PreflightResult()
    euid = probes.euid()
    r.add("root", euid == 0, "running as root" if euid == 0 else "run it as root: sudo ./install.sh",
          EXIT_NOT_ROOT)
    booted = probes.systemd_booted() and probes.which("systemctl") is not None
    r.add("systemd", booted, "systemd is PID 1" if booted else
          "systemd is not running as init (no /run/systemd/system); this installer needs a systemd host",
          EXIT_NO_SYSTEMD)
    if cpu:
        r.add("gpu", True, f"skipped (--cpu on {probes.machine()}): demonstration install, not a Spark",
              warning=True)
    else:
        gpu = check_gpu(probes, allow_unsupported_gpu)
        r.checks.extend(gpu)
        if not any(c.exit_code == EXIT_WRONG_ARCH for c in gpu):  # no Spark install happens there
            r.checks.append(toolkit.check_toolkit(probes))
            r.checks.append(toolkit.check_compiler(probes))
    r.checks.append(check_python(python, probes))
    r.checks.append(check_disk(layout, "cpu" if cpu else "spark", probes, venv_exists, reclaimable))
    if cpu:
        r.checks.append(check_demo_model(layout))
    else:
        r.checks.append(check_checkpoint(configured_model_dir(layout, source)))
    return r
