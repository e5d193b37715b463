"""What a Spark install needs on the host to build FlashInfer's kernels: driver, CUDA toolkit, g++.

The PyPI wheels of vLLM 0.32.0 carry no sm_121 FlashInfer kernels; the
install compiles them with the host's nvcc (FlashInfer's JIT), and the
service's engine finds that toolkit again at start (vLLM turns FlashInfer
off when it sees no nvcc). So the toolkit is checked before anything is
built, the way FlashInfer 0.7.0.post1 looks for it
(flashinfer/jit/cpp_ext.py: get_cuda_path): $CUDA_HOME, else $CUDA_PATH,
else the directory above `nvcc` on PATH, else /usr/local/cuda.

Stdlib only, like the rest of the installer; every host fact comes through
the preflight `Probes`, so tests can play any host.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Callable, Protocol

from .checks import Check
from ..base.exit_codes import EXIT_DRIVER, EXIT_TOOLKIT

# torch 2.13.0 on aarch64 (PyPI) is the CUDA 13.0 build, and CUDA 13.x runs on
# the r580 driver branch and newer; DGX OS ships 580.
MIN_DRIVER = 580
# FlashInfer needs CUDA >= 12.9 for any sm_12x target (compilation_context.py);
# the modules it builds link the toolkit's libcudart into the same process as
# torch's CUDA 13 runtime, so the toolkit has to be CUDA 13 as well.
CUDA_MAJOR = 13
DEFAULT_CUDA_HOME = Path("/usr/local/cuda")
TOOLKIT_PACKAGE = "cuda-toolkit-13-0"   # NVIDIA's apt repository, configured on DGX OS
INSTALL_TOOLKIT = f"sudo apt install {TOOLKIT_PACKAGE}"

# Headers FlashInfer 0.7.0.post1's CUTLASS MoE and MXFP8/FP4 quantization
# sources include from the toolkit (read from the wheel's data/csrc, with
# the includes followed through its vendored CUTLASS and CCCL); a toolkit
# assembled from pip's nvidia-* wheels typically lacks cublasLt.h,
# curand_kernel.h and nvrtc.h.
REQUIRED_HEADERS = (
    "cuda_runtime.h", "cuda.h", "cuda_fp8.h", "cuda_fp4.h", "cuda_bf16.h", "cooperative_groups.h",
    "cublasLt.h", "cublas_v2.h", "curand_kernel.h", "nvrtc.h", "nvtx3/nvToolsExt.h",
)
# What the modules link against: -lcudart -lcuda (the driver stub) -lnvrtc.
REQUIRED_LIBS = ("lib64/libcudart.so", "lib64/stubs/libcuda.so", "lib64/libnvrtc.so")


class ToolkitProbes(Protocol):
    env: Callable[[str], str | None]
    which: Callable[[str], str | None]
    nvcc_version: Callable[[Path], tuple[int, str]]
    is_file: Callable[[Path], bool]


def cuda_home(probes: ToolkitProbes) -> Path:
    """The toolkit FlashInfer's JIT will use."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if probes.env(var):
            return Path(probes.env(var))  # type: ignore[arg-type]
    nvcc = probes.which("nvcc")
    return Path(nvcc).parent.parent if nvcc else DEFAULT_CUDA_HOME


def parse_nvcc_release(output: str) -> tuple[int, int] | None:
    """`nvcc --version` -> (major, minor), FlashInfer's own pattern ("release 13.0,")."""
    m = re.search(r"release (\d+)\.(\d+),", output)
    return (int(m.group(1)), int(m.group(2))) if m else None


def driver_major(driver: str) -> int | None:
    m = re.match(r"\s*(\d+)", driver)
    return int(m.group(1)) if m else None


def check_driver(driver: str) -> Check:
    major = driver_major(driver)
    if major is None:
        return Check("driver", False, f"nvidia-smi reports driver version {driver!r}, which is not a number; "
                     f"check the driver (nvidia-smi); this install needs >= {MIN_DRIVER}", EXIT_DRIVER)
    if major < MIN_DRIVER:
        return Check("driver", False, f"NVIDIA driver {driver} is older than the CUDA 13 build of torch needs "
                     f"(>= {MIN_DRIVER}); update it (DGX OS: sudo apt update && sudo apt full-upgrade, "
                     "then reboot)", EXIT_DRIVER)
    return Check("driver", True, f"{driver} (>= {MIN_DRIVER} for CUDA 13)")


def check_toolkit(probes: ToolkitProbes) -> Check:
    home = cuda_home(probes)
    nvcc = home / "bin" / "nvcc"
    try:
        rc, out = probes.nvcc_version(nvcc)
    except (OSError, subprocess.TimeoutExpired):
        rc, out = -1, ""
    if rc != 0:
        return Check("cuda toolkit", False, f"no working nvcc at {nvcc} (FlashInfer's kernels are compiled at "
                     f"install): {INSTALL_TOOLKIT}, or set CUDA_HOME to a CUDA {CUDA_MAJOR} toolkit",
                     EXIT_TOOLKIT)
    release = parse_nvcc_release(out)
    if release is None:
        first = (out.strip().splitlines() or ["no output"])[-1]
        return Check("cuda toolkit", False, f"cannot read the CUDA version from `{nvcc} --version` ({first}); "
                     f"{INSTALL_TOOLKIT}, or set CUDA_HOME to a CUDA {CUDA_MAJOR} toolkit", EXIT_TOOLKIT)
    if release[0] != CUDA_MAJOR:
        return Check("cuda toolkit", False, f"{nvcc} is CUDA {release[0]}.{release[1]}; the Spark venv's torch "
                     f"and FlashInfer's sm_121a build need CUDA {CUDA_MAJOR}.x: {INSTALL_TOOLKIT}, and set "
                     "CUDA_HOME to it (or point /usr/local/cuda at it)", EXIT_TOOLKIT)
    missing = [h for h in REQUIRED_HEADERS if not probes.is_file(home / "include" / h)]
    missing += [lib for lib in REQUIRED_LIBS if not probes.is_file(home / lib)]
    if missing:
        return Check("cuda toolkit", False, f"{home} lacks {', '.join(missing)} (FlashInfer's MoE and "
                     f"quantization kernels need them): {INSTALL_TOOLKIT}, or set CUDA_HOME to a complete CUDA "
                     f"{CUDA_MAJOR} toolkit", EXIT_TOOLKIT)
    return Check("cuda toolkit", True, f"{home} (nvcc {release[0]}.{release[1]}, "
                 f"{len(REQUIRED_HEADERS)} headers and {len(REQUIRED_LIBS)} libraries present)")


def check_compiler(probes: ToolkitProbes) -> Check:
    cxx = probes.env("CXX") or "c++"   # FlashInfer's host compiler; nvcc calls g++ itself
    missing = [c for c in dict.fromkeys((cxx, "g++")) if probes.which(c) is None]
    if missing:
        return Check("compiler", False, f"no {' or '.join(missing)} on PATH (FlashInfer's kernels are compiled at "
                     "install): sudo apt install g++", EXIT_TOOLKIT)
    return Check("compiler", True, f"{probes.which('g++')}")
