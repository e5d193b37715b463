"""Where FlashInfer's JIT modules live, what keys them, and how many compile jobs memory allows.

Layout. FlashInfer puts a module at
    $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<flashinfer version>/<arch>/cached_ops/<name>/<name>.so
(flashinfer/jit/env.py). Its version and arch are in that path already; we add the
rest of what the .so depends on to the workspace base:
    <state_dir>/cache/flashinfer/cuda-<nvcc version>_tvm-ffi-<apache-tvm-ffi version>/
so a new toolkit or a new tvm-ffi (whose headers the modules compile against)
gets a fresh directory, and versions that share all of it share one build.

Why not rely on FlashInfer's own freshness check: the engine runs ninja on
every load, and FlashInfer's build.ninja names the venv's absolute paths (its
csrc/include/cutlass directories, the sources, tvm-ffi's headers). A new venv
writes a different build.ninja, ninja sees every command changed and rebuilds
all of it (over an hour on a Spark for the MoE module), and two venvs
alternating would rebuild each other's. So the engine does not go through
ninja for the prebuilt modules: the installer links each one into the venv's
flashinfer/data/aot/<name>/, the directory FlashInfer loads ahead-of-time
modules from without building (jit/env.py get_aot_artifacts, core.py
JitSpecNvcc.try_load), and `gptoss-spark flashinfer build` decides itself
whether a module is built, by the key above and a marker it writes last.

Parallelism. Unified memory: when compiles take the memory the weights need,
a Spark freezes instead of killing a process. One job of the CUTLASS MoE
module peaked at 10.4 GiB in a whole build (benchmarks/flashinfer_prebuild), so
    jobs = min(cores, floor((MemAvailable - 8 GiB) / 11 GiB)), at least 1
for the install-time build, and for a JIT inside the engine the same rule on
what the profile leaves free (MemAvailable - the profile's memory_gib). nvcc
runs one thread per job (FLASHINFER_NVCC_THREADS=1): each module targets one
architecture, and --threads only splits work across architectures.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Mapping

GIB = 2**30
PER_JOB_GIB = 11.0       # one nvcc job of the CUTLASS MoE: up to 10.38 GiB (sm120 grouped instantiation, whole build measured)
RESERVE_GIB = 8.0        # left for the OS, the supervisor and whatever else runs
NVCC_THREADS = 1
DEFAULT_CUDA_HOME = Path("/usr/local/cuda")
BUILT_MARKER = "gptoss-spark-built.json"
FLASHINFER_DIST = "flashinfer-python"
TVM_FFI_DIST = "apache-tvm-ffi"


def jobs_for(available_bytes: int, cores: int, *, reserve_gib: float = RESERVE_GIB,
             per_job_gib: float = PER_JOB_GIB) -> int:
    """Compile jobs that fit: min(cores, floor((available - reserve) / per job)), at least 1."""
    by_memory = math.floor((available_bytes / GIB - reserve_gib) / per_job_gib)
    return max(1, min(cores, by_memory))


def engine_jobs(available_bytes: int, cores: int, profile_memory_gib: float) -> int:
    """Jobs for a JIT inside the engine: by what is left once the profile's weights and cache are in."""
    return jobs_for(int(available_bytes - profile_memory_gib * GIB), cores)


def cuda_home(environ: Mapping[str, str] = os.environ) -> Path:
    """The toolkit FlashInfer compiles with: $CUDA_HOME, $CUDA_PATH, else /usr/local/cuda.

    FlashInfer would also try `which nvcc`; a systemd unit's PATH has no CUDA in
    it, so the engine and the build both get this one explicitly.
    """
    value = environ.get("CUDA_HOME") or environ.get("CUDA_PATH")
    return Path(value) if value else DEFAULT_CUDA_HOME


_NVCC_VERSION_RE = re.compile(r"\bV(\d+\.\d+\.\d+)\b")


def parse_nvcc_version(text: str) -> str | None:
    """'Cuda compilation tools, release 13.0, V13.0.88' -> '13.0.88'."""
    m = _NVCC_VERSION_RE.search(text)
    return m.group(1) if m else None


def nvcc_version(home: Path) -> str | None:
    try:
        out = subprocess.run([str(home / "bin" / "nvcc"), "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_nvcc_version(out)


def dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def arch_dir_name(arch_list: str) -> str:
    """FlashInfer's <arch> directory for FLASHINFER_CUDA_ARCH_LIST (jit/env.py _get_workspace_dir_name).

    "12.1a" -> "121a"; several, space-separated, sorted and joined by "_". Only
    suffixed entries (as the profiles write them) map without a toolkit query.
    """
    archs = set()
    for arch in arch_list.split(" "):
        if not arch:
            continue
        major, _, minor = arch.partition(".")
        if not minor or not minor[-1].isalpha():
            raise ValueError(f"FLASHINFER_CUDA_ARCH_LIST entry {arch!r}: write it with its suffix, e.g. 12.1a")
        archs.add((int(major), minor))
    return "_".join(f"{major}{minor}" for major, minor in sorted(archs))


@dataclass(frozen=True)
class CacheKey:
    flashinfer: str
    nvcc: str
    tvm_ffi: str

    @property
    def dir_name(self) -> str:
        return f"cuda-{self.nvcc}_tvm-ffi-{self.tvm_ffi}"

    def workspace_base(self, cache_root: Path) -> Path:
        """FLASHINFER_WORKSPACE_BASE for this key."""
        return cache_root / self.dir_name

    def jit_dir(self, cache_root: Path, arch_list: str) -> Path:
        """FlashInfer's cached_ops/ under that base (jit/env.py FLASHINFER_JIT_DIR)."""
        return (self.workspace_base(cache_root) / ".cache" / "flashinfer" / self.flashinfer
                / arch_dir_name(arch_list) / "cached_ops")

    def module_dir(self, cache_root: Path, arch_list: str, name: str) -> Path:
        return self.jit_dir(cache_root, arch_list) / name


class NoCacheKey(Exception):
    """Why no key can be made (FlashInfer not installed, no nvcc)."""


def current_key(environ: Mapping[str, str] = os.environ) -> CacheKey:
    """The key for this interpreter's FlashInfer and tvm-ffi and the toolkit at cuda_home()."""
    fi = dist_version(FLASHINFER_DIST)
    if fi is None:
        raise NoCacheKey(f"{FLASHINFER_DIST} is not installed in this environment")
    tvm = dist_version(TVM_FFI_DIST)
    if tvm is None:
        raise NoCacheKey(f"{TVM_FFI_DIST} is not installed in this environment")
    home = cuda_home(environ)
    nvcc = nvcc_version(home)
    if nvcc is None:
        raise NoCacheKey(f"no working nvcc at {home / 'bin' / 'nvcc'}; install the CUDA toolkit "
                        "or set CUDA_HOME")
    return CacheKey(fi, nvcc, tvm)


def is_built(module_dir: Path, name: str) -> bool:
    """Built by `gptoss-spark flashinfer build` for this key: the .so and our marker, written after it."""
    return (module_dir / f"{name}.so").is_file() and (module_dir / BUILT_MARKER).is_file()


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def engine_env(cache_root: Path, key: CacheKey | None, python_bin: Path, environ: Mapping[str, str], *,
               available_bytes: int, cores: int, profile_memory_gib: float) -> dict[str, str]:
    """What the engine needs so a FlashInfer JIT finds its tools, its cache and a bounded job count.

    CUDA_HOME and ninja on PATH also decide whether vLLM uses FlashInfer at all:
    vllm.utils.flashinfer.has_flashinfer() is False without nvcc under CUDA_HOME
    and `ninja` on PATH, and a systemd unit's PATH has neither (ninja is in the venv).
    """
    env = {
        "CUDA_HOME": str(cuda_home(environ)),
        "PATH": os.pathsep.join([str(python_bin), environ.get("PATH", os.defpath)]),
        "MAX_JOBS": str(engine_jobs(available_bytes, cores, profile_memory_gib)),
        "FLASHINFER_NVCC_THREADS": str(NVCC_THREADS),
    }
    if key is not None:
        env["FLASHINFER_WORKSPACE_BASE"] = str(key.workspace_base(cache_root))
    return env
